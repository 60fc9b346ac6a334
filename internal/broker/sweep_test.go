package broker

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckBatchesReuse: batches hold at most MaxTxnOps ops, keep one
// owner's ops together, and a round after reset gives the same batches as
// a fresh value would, with nothing of the earlier round left over.
func TestCheckBatchesReuse(t *testing.T) {
	round := func(c *checkBatches[int], owners, opsEach int, tag string) {
		c.reset()
		for o := range owners {
			ops := make([]Op, 1+(o+opsEach)%3) // 1 to 3 ops, as a swept key has
			for j := range ops {
				ops[j] = Op{Verb: OpCheckIndex, Key: fmt.Sprintf("%s/%d/%d", tag, o, j)}
			}
			c.add(o, ops...)
		}
	}
	check := func(t *testing.T, c *checkBatches[int], owners int, tag string) {
		t.Helper()
		require.Equal(t, len(c.ops), len(c.owners))
		seen := map[int]int{} // owner → its batch
		for i := range c.ops {
			require.LessOrEqual(t, len(c.ops[i]), MaxTxnOps, "batch %d", i)
			require.Equal(t, len(c.ops[i]), len(c.owners[i]), "batch %d", i)
			for j, op := range c.ops[i] {
				o := c.owners[i][j]
				assert.Regexp(t, fmt.Sprintf("^%s/%d/", tag, o), op.Key, "op of owner %d", o)
				if b, ok := seen[o]; ok {
					assert.Equal(t, b, i, "owner %d's ops are in one batch", o)
				}
				seen[o] = i
			}
		}
		assert.Len(t, seen, owners)
	}
	var c checkBatches[int]
	round(&c, 500, 0, "a")
	check(t, &c, 500, "a")
	first := len(c.ops)

	round(&c, 100, 1, "b") // fewer: earlier batches beyond this round are not sent
	check(t, &c, 100, "b")
	assert.Less(t, len(c.ops), first)

	round(&c, 700, 2, "c") // more: the kept batches and new ones
	check(t, &c, 700, "c")

	var fresh checkBatches[int]
	round(&fresh, 700, 2, "c")
	assert.Equal(t, fresh.ops, c.ops, "a reused value batches as a fresh one does")
	assert.Equal(t, fresh.owners, c.owners)

	c.reset()
	assert.Empty(t, c.ops)
	for _, b := range c.ops[:cap(c.ops)] {
		for _, op := range b[:cap(b)] {
			assert.Empty(t, op.Key, "reset keeps no key of the last round")
		}
	}
}
