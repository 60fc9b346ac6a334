package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// MutantCheckers pairs each mutant with the checkers made to catch what it
// breaks (docs/chaos.md, "Mutants"). A mutant run counts as caught only when
// one of them fails: another checker's failure (a starvation bound missed on
// a loaded machine, say) proves nothing about the defect the mutant plants.
// The issue-43 mutants and no-shared-queue each have exactly one.
var MutantCheckers = map[string][]string{
	"no-loss-notice":          {CheckerLoss, CheckerOverlap},
	"no-fencing":              {CheckerFencing, CheckerLinear},
	"no-resume-fence":         {CheckerLoss, CheckerOverlap},
	"no-shared-queue":         {CheckerStarvation},
	"rw-reader-beside-writer": {CheckerRW},
	"rw-stale-token":          {CheckerTokens},
	"multi-partial":           {CheckerMulti},
}

// MutantVerdict is how one run of a mutant went.
type MutantVerdict struct {
	// Caught: a checker paired with the mutant failed.
	Caught bool
	// By are the paired checkers that failed; Others the other checkers
	// that failed (no-leaks left out: leftovers are no mutant's defect),
	// each marked when it also failed on the real build.
	By, Others []string
}

// JudgeMutant judges a run of mutant whose failed checkers are failed;
// realFailed are the checkers that failed on the real build of the same
// invocation (nil when it did not run).
func JudgeMutant(mutant string, failed []string, realFailed map[string]bool) MutantVerdict {
	var v MutantVerdict
	paired := MutantCheckers[mutant]
	for _, f := range failed {
		if f == CheckerLeaks {
			continue
		}
		name := f
		if realFailed[f] {
			name += " (also failed on the real build)"
		}
		if slices.Contains(paired, f) {
			v.By = append(v.By, name)
		} else {
			v.Others = append(v.Others, name)
		}
	}
	sort.Strings(v.By)
	sort.Strings(v.Others)
	v.Caught = len(v.By) > 0
	return v
}

// String is the verdict for the summary line of mutant.
func (v MutantVerdict) String(mutant string) string {
	others := ""
	if len(v.Others) > 0 {
		others = fmt.Sprintf("; other checkers failed too: %s", strings.Join(v.Others, ", "))
	}
	if v.Caught {
		return fmt.Sprintf("caught by %s%s", strings.Join(v.By, ", "), others)
	}
	return fmt.Sprintf("NOT CAUGHT by its checker (%s passed)%s", strings.Join(MutantCheckers[mutant], ", "), others)
}
