package broker

import (
	"context"
	"time"
)

// mutantOneByOne is the multi-partial mutant's broken grant (see
// mutant_issue43_off.go): it takes the lock ops among ops one per
// transaction, 100 ms apart, as a one-by-one multi-lock would; a key
// another session holds is skipped, and what it took stays taken.
func mutantOneByOne(ctx context.Context, st Store, ops []Op) {
	for _, op := range ops {
		if op.Verb != OpLock {
			continue
		}
		_, _ = st.Txn(ctx, []Op{op})
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
