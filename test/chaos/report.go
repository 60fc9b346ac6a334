package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run, written as JSON and printed as a table.
type Report struct {
	Seed            uint64         `json:"seed"`
	Mutant          string         `json:"mutant,omitempty"`
	Profile         string         `json:"profile"`
	DurationSeconds float64        `json:"duration_seconds"`
	Clients         map[string]int `json:"clients"`
	FaultsPlanned   int            `json:"faults_planned"`
	Faults          int            `json:"faults"`
	FaultsByKind    map[string]int `json:"faults_by_kind"`
	Holds           int            `json:"holds"`
	Acquisitions    int            `json:"acquisitions"`
	AcquireFailures int            `json:"acquire_failures"`
	Resumes         int            `json:"resume_attempts"`
	Writes          int            `json:"writes"`
	Checks          int            `json:"reads"`
	Observations    int            `json:"observations"`
	Losses          LossStats      `json:"losses"`
	LossP50Millis   float64        `json:"loss_notice_p50_ms"`
	LossP99Millis   float64        `json:"loss_notice_p99_ms"`
	LossMaxMillis   float64        `json:"loss_notice_max_ms"`
	FencingRefusals int            `json:"fencing_refusals"`
	Porcupine       string         `json:"porcupine"`
	LivenessBound   string         `json:"liveness_bound"`
	Checkers        []Result       `json:"checkers"`
	Notes           []string       `json:"notes,omitempty"`
	Schedule        *Schedule      `json:"schedule"`
	OutDir          string         `json:"out_dir"`
}

// Failed lists the checkers that found violations.
func (r *Report) Failed() []string {
	var out []string
	for _, c := range r.Checkers {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

// report runs every checker over the snapshot.
func (r *run) report(s *Snapshot, sched *Schedule, left Leftovers, d time.Duration) *Report {
	rep := &Report{Seed: r.cfg.Seed, Mutant: r.cfg.Mutant, Profile: r.p.Name, DurationSeconds: d.Seconds(),
		Clients: map[string]int{}, FaultsPlanned: sched.Count(), Schedule: sched, OutDir: r.cfg.OutDir}
	kinds := map[int]ClientKind{}
	for _, c := range r.clients {
		rep.Clients[string(c.Kind)]++
		kinds[c.ID] = c.Kind
	}
	rep.FaultsByKind, rep.Faults = r.faults.snapshot()
	rep.Holds = len(s.Holds)
	for _, a := range s.Attempts {
		if a.OK {
			rep.Acquisitions++
		} else {
			rep.AcquireFailures++
		}
	}
	for _, h := range s.Holds {
		rep.Resumes += h.Resumes
	}
	rep.Writes, rep.Checks, rep.Observations = len(s.Writes), len(s.Checks), len(s.Observations)
	for _, w := range s.Writes {
		if !w.Accepted {
			rep.FencingRefusals++
		}
	}
	r.logf("checking %d holds, %d writes, %d reads", len(s.Holds), len(s.Writes), len(s.Checks))
	fencing := CheckFencing(s)
	overlap := CheckOverlap(s)
	lin, verdict := CheckLinearizable(s, r.p.LinTimeout, filepath.Join(r.cfg.OutDir, "porcupine.html"))
	rep.Porcupine = string(verdict)
	loss, st := CheckLoss(s, lossBounds)
	rep.Losses = st
	rep.LossP50Millis, rep.LossP99Millis, rep.LossMaxMillis = millis(st.P50), millis(st.P99), millis(st.Max)
	rep.Checkers = []Result{fencing, overlap, lin, loss}
	rep.LivenessBound = fmt.Sprintf("a vanished holder's lock is released (seen free by a consistent read, or granted anew) within %s (20s + lock-delay + 1s)", r.p.Vanish())
	if r.p.CheckLiveness {
		rep.LivenessBound = fmt.Sprintf("recovery %s (2×TTL + lock-delay + 5s) then the rest of a %s quiet period; ", r.p.Recovery(), r.p.QuietLen) + rep.LivenessBound
	} else {
		s.Quiets = nil
	}
	rep.Checkers = append(rep.Checkers, CheckLiveness(s, r.p.Recovery(), r.p.Vanish(), kinds))
	sb := starvationBounds
	sb.Settle = r.p.Recovery()
	rep.Checkers = append(rep.Checkers, CheckStarvation(s, sb))
	rep.Checkers = append(rep.Checkers, CheckRW(s), CheckMulti(s), CheckTokenOrder(s))
	rep.Checkers = append(rep.Checkers, CheckLeaks(left))
	r.mu.Lock()
	rep.Notes = append(rep.Notes, r.notes...)
	r.mu.Unlock()
	return rep
}

// lossBounds are DESIGN.md's: a loss is learned by the guaranteed
// deadline (100ms of slack for timers on a loaded 2-core machine), and
// within 1s when the hold is taken away in Consul.
var lossBounds = LossBounds{Slack: 100 * time.Millisecond, Taken: takenBound}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Print writes the report as a table, then the examples of violations.
func (r *Report) Print(w io.Writer) {
	name := "normal build"
	if r.Mutant != "" {
		name = "MUTANT " + r.Mutant
	}
	fmt.Fprintf(w, "\n=== chaos report: %s, profile %s, seed %d (replay: SEED=%d) ===\n", name, r.Profile, r.Seed, r.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("duration", time.Duration(r.DurationSeconds*float64(time.Second)).Round(time.Second))
	row("clients", describeKinds(r.Clients))
	row("faults injected", fmt.Sprintf("%d (planned %d)", r.Faults, r.FaultsPlanned))
	row("faults by kind", describeKinds(r.FaultsByKind))
	row("holds / acquisitions", fmt.Sprintf("%d / %d (%d acquire errors)", r.Holds, r.Acquisitions, r.AcquireFailures))
	row("resume attempts", r.Resumes)
	row("losses by reason", describeKinds(r.Losses.ByReason))
	row("loss notice after fault", fmt.Sprintf("p50 %.0fms  p99 %.0fms  max %.0fms  (%d measured, %d with no fault)",
		r.LossP50Millis, r.LossP99Millis, r.LossMaxMillis, r.Losses.N, r.Losses.Unattributed))
	row("writes / fencing refusals", fmt.Sprintf("%d / %d", r.Writes, r.FencingRefusals))
	row("reads (CheckSequencer, GetLock)", r.Checks)
	row("watch observations", r.Observations)
	row("porcupine", r.Porcupine)
	if r.LivenessBound != "" {
		row("liveness bound", r.LivenessBound)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "CHECKER\tRESULT\tVIOLATIONS\tWHAT WAS CHECKED\n")
	for _, c := range r.Checkers {
		res := "ok"
		if !c.OK {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", c.Name, res, c.Count, c.Summary)
	}
	tw.Flush()
	for _, c := range r.Checkers {
		for i, v := range c.Violations {
			if i == 3 {
				fmt.Fprintf(w, "  [%s] … %d more in the JSON report\n", c.Name, c.Count-3)
				break
			}
			fmt.Fprintf(w, "  [%s] at %s %s: %s\n", c.Name, ms(v.At), v.Key, v.Msg)
			for _, e := range v.Excerpt {
				fmt.Fprintf(w, "      %s\n", e)
			}
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintf(w, "notes (faults not injected as planned): %s\n", strings.Join(uniq(r.Notes), "; "))
	}
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
