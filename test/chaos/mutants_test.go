package chaos

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMutantCheckersPairEveryMutant(t *testing.T) {
	known := map[string]bool{CheckerFencing: true, CheckerOverlap: true, CheckerLinear: true, CheckerLoss: true,
		CheckerLiveness: true, CheckerStarvation: true, CheckerRW: true, CheckerMulti: true, CheckerTokens: true}
	for m := range Mutants {
		require.NotEmpty(t, MutantCheckers[m], "%s has no paired checker", m)
		for _, c := range MutantCheckers[m] {
			assert.True(t, known[c], "%s: %q is not a checker that judges mutants", m, c)
		}
	}
	assert.Len(t, MutantCheckers, len(Mutants))
	for m, want := range map[string]string{"rw-reader-beside-writer": CheckerRW, "rw-stale-token": CheckerTokens,
		"multi-partial": CheckerMulti, "no-shared-queue": CheckerStarvation} {
		assert.Equal(t, []string{want}, MutantCheckers[m], "%s is caught by its own checker only", m)
	}
}

func TestJudgeMutant(t *testing.T) {
	// The CI run that motivated the pairing: rw-stale-token failed the
	// starvation checker only.
	v := JudgeMutant("rw-stale-token", []string{CheckerStarvation, CheckerLeaks}, nil)
	assert.False(t, v.Caught)
	assert.Empty(t, v.By)
	assert.Equal(t, []string{CheckerStarvation}, v.Others, "no-leaks is no mutant's defect")
	assert.Contains(t, v.String("rw-stale-token"), "NOT CAUGHT by its checker (token-order passed)")
	assert.Contains(t, v.String("rw-stale-token"), "starvation")

	v = JudgeMutant("rw-stale-token", []string{CheckerStarvation, CheckerTokens}, map[string]bool{CheckerStarvation: true})
	assert.True(t, v.Caught)
	assert.Equal(t, []string{CheckerTokens}, v.By)
	assert.Equal(t, []string{CheckerStarvation + " (also failed on the real build)"}, v.Others)
	assert.Equal(t, "caught by token-order; other checkers failed too: starvation (also failed on the real build)", v.String("rw-stale-token"))

	// Each issue-43 mutant and no-shared-queue: only its own checker counts.
	for m, own := range map[string]string{"rw-reader-beside-writer": CheckerRW, "multi-partial": CheckerMulti, "no-shared-queue": CheckerStarvation} {
		var others []string
		for _, c := range []string{CheckerFencing, CheckerOverlap, CheckerLinear, CheckerLoss, CheckerLiveness, CheckerStarvation, CheckerRW, CheckerMulti, CheckerTokens} {
			if c != own {
				others = append(others, c)
			}
		}
		assert.False(t, JudgeMutant(m, others, nil).Caught, "%s: every other checker failing does not catch it", m)
		assert.True(t, JudgeMutant(m, []string{own}, nil).Caught, m)
	}
	// The older mutants: either of their checkers.
	assert.True(t, JudgeMutant("no-loss-notice", []string{CheckerOverlap}, nil).Caught)
	assert.True(t, JudgeMutant("no-fencing", []string{CheckerLinear}, nil).Caught)
	assert.False(t, JudgeMutant("no-fencing", []string{CheckerOverlap}, nil).Caught)
	assert.False(t, JudgeMutant("no-resume-fence", nil, nil).Caught)
}
