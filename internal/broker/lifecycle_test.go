package broker

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLifecycle(t *testing.T) {
	lostBy := func(r LostReason) Outcome { return Outcome{Kind: OutcomeLost, Reason: r} }
	tests := []struct {
		name  string
		steps func(l *Lifecycle)
		want  Outcome
		ended bool
	}{
		{"granted then released", func(l *Lifecycle) {
			l.Grant()
			l.BeginRelease()
			l.EndRelease(true)
		}, Outcome{Kind: OutcomeReleased}, true},
		{"loss during a release that succeeds is a release", func(l *Lifecycle) {
			l.Grant()
			l.BeginRelease()
			l.End(lostBy(LostReleasedByOther)) // the watch saw our own unlock
			l.EndRelease(true)
		}, Outcome{Kind: OutcomeReleased}, true},
		{"loss during a release that fails stands", func(l *Lifecycle) {
			l.Grant()
			l.BeginRelease()
			l.End(lostBy(LostDeletedByOther))
			l.EndRelease(false)
		}, lostBy(LostDeletedByOther), true},
		{"failed release goes back to held", func(l *Lifecycle) {
			l.Grant()
			l.BeginRelease()
			l.EndRelease(false)
		}, Outcome{}, false},
		{"first decision wins", func(l *Lifecycle) {
			l.Grant()
			l.End(Outcome{Kind: OutcomeResumed})
			l.End(lostBy(LostSessionInvalidated))
			l.BeginRelease()
			l.EndRelease(true)
		}, Outcome{Kind: OutcomeResumed}, true},
		{"no release before the grant", func(l *Lifecycle) {
			assert.False(t, l.BeginRelease())
			l.End(Outcome{Kind: OutcomeFailed})
			assert.False(t, l.Grant(), "no grant after the end")
		}, Outcome{Kind: OutcomeFailed}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLifecycle()
			tt.steps(l)
			got, ended := l.Outcome()
			assert.Equal(t, tt.ended, ended)
			if tt.ended {
				assert.Equal(t, tt.want, got)
				select {
				case <-l.Done():
				default:
					t.Error("Done not closed after the end")
				}
			}
		})
	}
}

// FuzzLifecycle drives a lifecycle with random event orders and checks
// its invariants: one outcome, never changed once decided; Done closed
// exactly when it is decided; released only through a release that
// succeeded; a loss seen while releasing decides only if the release
// fails.
func FuzzLifecycle(f *testing.F) {
	f.Add([]byte{0, 1, 3, 2})
	f.Add([]byte{0, 1, 4, 3, 5})
	f.Add([]byte{3, 0, 1, 2, 6})
	f.Fuzz(func(t *testing.T, events []byte) {
		l := NewLifecycle()
		var decided *Outcome
		releasing, pending := false, (*Outcome)(nil)
		for _, e := range events {
			before, wasEnded := l.Outcome()
			switch e % 7 {
			case 0:
				ok := l.Grant()
				if ok && (decided != nil || l.Phase() != PhaseHeld) {
					t.Fatal("granted after the end")
				}
			case 1:
				if l.BeginRelease() {
					releasing = true
				}
			case 2, 5:
				ok := e%7 == 2
				if releasing && decided == nil {
					switch {
					case ok:
						decided = &Outcome{Kind: OutcomeReleased}
					case pending != nil:
						decided = pending
					}
				}
				l.EndRelease(ok)
				releasing, pending = false, nil
			case 3, 4, 6:
				o := Outcome{Kind: OutcomeLost, Reason: LostReason(e%7 - 2)}
				if e%7 == 6 {
					o = Outcome{Kind: OutcomeResumed}
				}
				took := l.End(o)
				switch {
				case decided == nil && releasing:
					if took {
						t.Fatal("an End decided during a release")
					}
					if pending == nil {
						pending = &o
					}
				case decided == nil:
					if !took {
						t.Fatal("the first End did not decide")
					}
					decided = &o
				case took:
					t.Fatal("a second End decided")
				}
			}
			got, ended := l.Outcome()
			if wasEnded && got != before {
				t.Fatalf("the outcome changed from %v to %v", before, got)
			}
			if ended != (decided != nil) {
				t.Fatalf("ended %v, model decided %v", ended, decided)
			}
			if ended && got != *decided {
				t.Fatalf("outcome %v, model %v", got, *decided)
			}
			select {
			case <-l.Done():
				if !ended {
					t.Fatal("Done closed before the end")
				}
			default:
				if ended {
					t.Fatal("Done not closed at the end")
				}
			}
		}
	})
}
