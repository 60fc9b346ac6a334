package server

import (
	"fmt"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// maxMultiKeys is how many keys a multi-key lock takes at most: `key` and
// 63 in `keys` (the proto's max_items). Each key costs two operations of
// the one Consul transaction that queues or grants the request, and a
// transaction has at most broker.MaxTxnOps (128).
const maxMultiKeys = 64

// maxMultiValue bounds the values a multi-key grant writes, all keys
// together: the one value limit (256 KiB) of a single-key grant, so that
// the transaction fits Consul's default txn_max_req_len (512 KiB).
const maxMultiValue = 262144

// checkMultiKey refuses what a multi-key lock (AcquireRequest.keys) cannot
// be, naming `keys`: protovalidate checked each key's syntax, their count
// and that they are distinct (the interceptor runs first); this checks
// what the proto's rules cannot say. A request without `keys` passes.
func checkMultiKey(req *lockbrokerv1.AcquireRequest) error {
	keys := req.GetKeys()
	if len(keys) == 0 {
		return nil
	}
	refuse := func(format string, args ...any) error {
		return &broker.Error{Kind: broker.ErrInvalid, Reason: broker.ReasonInvalidArgument, Field: "keys",
			Msg: "keys: " + fmt.Sprintf(format, args...)}
	}
	switch k := req.GetKind(); {
	case k != lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED && k != lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK:
		return refuse("a multi-key lock takes locks only; kind %s cannot have keys", k)
	case req.GetLimit() > 1:
		return refuse("a multi-key lock takes locks only; limit %d (a semaphore) cannot have keys", req.GetLimit())
	case len(keys)+1 > maxMultiKeys:
		return refuse("at most %d keys with `key`, got %d", maxMultiKeys-1, len(keys))
	case len(req.GetValue())*(len(keys)+1) > maxMultiValue:
		return &broker.Error{Kind: broker.ErrInvalid, Reason: broker.ReasonInvalidArgument, Field: "value",
			Msg: fmt.Sprintf("value: with %d keys at most %d bytes (every key gets the value, in one transaction of at most %d bytes of values), got %d", len(keys)+1, maxMultiValue/(len(keys)+1), maxMultiValue, len(req.GetValue()))}
	case req.GetSessionId() != "":
		return refuse("a multi-key lock needs a session of the broker's own (new_session, or none): session_id cannot have keys")
	}
	seen := make(map[string]bool, len(keys)+1)
	seen[req.GetKey()] = true
	for i, k := range keys {
		if seen[k] {
			if k == req.GetKey() {
				return refuse("keys[%d] %q repeats `key`", i, k)
			}
			return refuse("keys[%d] %q is repeated", i, k)
		}
		seen[k] = true
	}
	return nil
}
