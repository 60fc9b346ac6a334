package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// TestEveryRequestIsCovered fails when an RPC is added to LockService,
// SessionService or AdminService without telling the access layer what
// its request names (in multi-tenant mode an uncovered LockService
// request is refused).
func TestEveryRequestIsCovered(t *testing.T) {
	for _, fd := range []protoreflect.FileDescriptor{
		lockbrokerv1.File_lockbroker_v1_lock_proto,
		lockbrokerv1.File_lockbroker_v1_session_proto,
		lockbrokerv1.File_lockbroker_v1_admin_proto,
	} {
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
				require.NoError(t, err)
				n := namedBy(mt.New().Interface())
				assert.True(t, n.covered, "%s/%s: request %s not covered by namedBy", svc.FullName(), m.Name(), m.Input().FullName())
				if m.Input().Fields().ByName("key") != nil && svc.Name() == "LockService" {
					assert.NotEmpty(t, n.keys, "%s names a key", m.Name())
				}
			}
		}
	}
}
