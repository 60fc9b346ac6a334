package grpcurl_test

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/readme"
)

// The README's read-write lock block, as written: two read holds at once
// (the first command twice), then the write hold, which waits for both
// readers and is granted once they are gone with a token above theirs,
// then GetLock.
func TestReadmeGrpcurlReadWrite(t *testing.T) {
	b := brokertest.StartDev(t)
	bin := brokertest.BuildIn(t, filepath.Join(brokertest.RepoRoot(t), "tools", "go"),
		"github.com/fullstorydev/grpcurl/cmd/grpcurl", "grpcurl")
	sh := shell{path: filepath.Dir(bin), addr: b.Addr}
	cmds := readme.Commands(readme.Block(t, "grpcurl-rwlock"))
	require.Len(t, cmds, 3, "read, write, GetLock")
	read, write, get := cmds[0], cmds[1], cmds[2]
	require.Contains(t, read, "ACQUIRE_KIND_READ")
	require.Contains(t, write, "ACQUIRE_KIND_WRITE")

	tokens := func(out string) []uint64 {
		var ts []uint64
		for _, m := range regexp.MustCompile(`"token": "([0-9]+)"`).FindAllStringSubmatch(out, -1) {
			n, err := strconv.ParseUint(m[1], 10, 64)
			require.NoError(t, err)
			ts = append(ts, n)
		}
		return ts
	}
	acquired := func(p *proc) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Contains(p.out.String(), `"acquired"`) },
			10*time.Second, 20*time.Millisecond, "no acquired: %s", p.out.String())
	}
	r1 := sh.start(t, "exec "+read)
	acquired(r1)
	r2 := sh.start(t, "exec "+read)
	acquired(r2)
	assert.Contains(t, r1.out.String(), `"read": true`)
	assert.Contains(t, r2.out.String(), `"read": true`)

	w := sh.start(t, "exec "+write)
	require.Eventually(t, func() bool { return strings.Contains(w.out.String(), `"queued"`) },
		10*time.Second, 20*time.Millisecond, "the writer does not wait: %s", w.out.String())

	out, err := sh.run(t, get)
	require.NoError(t, err, out)
	assert.Contains(t, out, "LOCK_KIND_RWLOCK")
	assert.Equal(t, 2, strings.Count(out, `"read": true`), "two readers hold: %s", out)

	// The readers' grpcurl stop: their holds end at the latest when their
	// guarantee runs out (as the README says of Ctrl-C), and the writer is
	// granted, with a token above both readers'.
	rtokens := append(tokens(r1.out.String()), tokens(r2.out.String())...)
	require.NotEmpty(t, rtokens)
	require.NoError(t, r1.cmd.Process.Kill())
	require.NoError(t, r2.cmd.Process.Kill())
	require.Eventually(t, func() bool { return strings.Contains(w.out.String(), `"acquired"`) },
		ctrlCBound, 50*time.Millisecond, "the writer was never granted: %s", w.out.String())
	wt := tokens(w.out.String())
	require.NotEmpty(t, wt)
	for _, r := range rtokens {
		assert.Greater(t, wt[len(wt)-1], r, "the writer's token is above the readers'")
	}
	granted := w.out.String()[strings.LastIndex(w.out.String(), `"acquired"`):]
	assert.NotContains(t, granted, `"read": true`, "the writer's sequencer is not a read")
}
