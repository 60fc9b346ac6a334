package chaos

import (
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The operations of the lock-plus-fenced-register model.
const (
	opAcquire = "acquire"  // a grant received: Output.Token
	opWrite   = "write"    // a write to the fenced resource: Input.Token, Output.OK
	opCheck   = "checkseq" // CheckSequencer(Input.Token): Output.OK = current
	opGetLock = "getlock"  // GetLock: Output.Token = holder's token, 0 for none
)

type linInput struct {
	Op    string
	Key   string
	Token uint64
}

type linOutput struct {
	OK    bool
	Token uint64
}

// linState is one key's state in the model.
type linState struct {
	Granted  uint64 // highest grant known (acquired or seen by a read)
	Acquired uint64 // highest grant an Acquire returned
	Holder   uint64 // the current grant as far as the model knows, 0 for none/unknown
	MaxTok   uint64 // highest token the resource accepted
}

// lockModel is the sequential specification of one lock key with its
// fenced register. A lease may end at any moment without an operation (a
// session expires), so the model never demands that a holder still holds;
// it demands what a lease lock with sequencers does promise:
//   - grants are totally ordered by token: an Acquire returns a token
//     higher than every grant before it (acquired or seen by a read);
//   - reads are never stale: GetLock returns the current grant or none,
//     or a newer grant nobody has reported yet, never an older grant; and
//     CheckSequencer says current only for the current grant, and a grant
//     seen gone never comes back;
//   - the resource accepts a write iff its token is not lower than the
//     highest it accepted.
var lockModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		parts := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linInput).Key
			parts[k] = append(parts[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(parts))
		for _, k := range sortedKeys(parts) {
			out = append(out, parts[k])
		}
		return out
	},
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(linState), input.(linInput), output.(linOutput)
		switch in.Op {
		case opAcquire:
			if out.Token <= st.Acquired || out.Token < st.Granted {
				return false, st
			}
			st.Acquired, st.Granted, st.Holder = out.Token, out.Token, out.Token
			return true, st
		case opWrite:
			if out.OK != (in.Token >= st.MaxTok) {
				return false, st
			}
			st.MaxTok = max(st.MaxTok, in.Token)
			return true, st
		case opCheck:
			if out.OK {
				return st.Holder == in.Token, st
			}
			if st.Holder == in.Token {
				st.Holder = 0
			}
			return true, st
		case opGetLock:
			switch {
			case out.Token == 0:
				st.Holder = 0
				return true, st
			case out.Token == st.Holder:
				return true, st
			case out.Token > st.Granted:
				st.Granted, st.Holder = out.Token, out.Token
				return true, st
			}
			return false, st
		}
		return false, st
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		switch in.Op {
		case opAcquire:
			return fmt.Sprintf("acquire → %d", out.Token)
		case opWrite:
			return fmt.Sprintf("write(%d) → %v", in.Token, out.OK)
		case opCheck:
			return fmt.Sprintf("checkseq(%d) → %v", in.Token, out.OK)
		default:
			return fmt.Sprintf("getlock → %d", out.Token)
		}
	},
	DescribeState: func(state any) string {
		st := state.(linState)
		return fmt.Sprintf("granted %d acquired %d holder %d maxTok %d", st.Granted, st.Acquired, st.Holder, st.MaxTok)
	},
}

// linOps builds the model's history from a snapshot: lock keys only
// (semaphores and read-write locks have several holders: CheckRW and
// CheckTokenOrder judge the latter).
func linOps(s *Snapshot) []porcupine.Operation {
	var ops []porcupine.Operation
	rw := rwKeys(s)
	add := func(client int, in linInput, out linOutput, call, ret time.Duration) {
		ops = append(ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: int64(call), Return: int64(ret)})
	}
	for _, h := range s.Holds {
		if s.limit(h.Key) != 1 || rw[h.Key] {
			continue
		}
		add(h.Client, linInput{Op: opAcquire, Key: h.Key}, linOutput{Token: h.Token}, h.Call, h.Acquired)
	}
	for _, w := range s.Writes {
		if s.limit(w.Key) != 1 || rw[w.Key] {
			continue
		}
		add(w.Client, linInput{Op: opWrite, Key: w.Key, Token: w.Token}, linOutput{OK: w.Accepted}, w.Call, w.Return)
	}
	for _, c := range s.Checks {
		if s.limit(c.Key) != 1 || rw[c.Key] {
			continue
		}
		if c.GetLock {
			add(c.Client, linInput{Op: opGetLock, Key: c.Key}, linOutput{Token: c.Holder}, c.Call, c.Return)
		} else {
			add(c.Client, linInput{Op: opCheck, Key: c.Key, Token: c.Token}, linOutput{OK: c.Current}, c.Call, c.Return)
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// CheckLinearizable runs porcupine over the snapshot with the
// lock-plus-fenced-register model. A verdict of Unknown (the search timed
// out) is not a violation; it is reported as such. When vizPath is not
// empty and the history is not linearizable, porcupine's visualization is
// written there.
func CheckLinearizable(s *Snapshot, timeout time.Duration, vizPath string) (Result, porcupine.CheckResult) {
	r := newResult(CheckerLinear)
	ops := linOps(s)
	verdict, info := porcupine.CheckOperationsVerbose(lockModel, ops, timeout)
	r.Summary = fmt.Sprintf("porcupine over %d operations (lock + fenced register): %s", len(ops), verdict)
	if verdict == porcupine.Illegal {
		v := Violation{Msg: "the history is not linearizable with the lock-plus-fenced-register model"}
		v.Excerpt = illegalExcerpt(ops)
		if vizPath != "" {
			if f, err := os.Create(vizPath); err == nil {
				if porcupine.Visualize(lockModel, info, f) == nil {
					v.Excerpt = append(v.Excerpt, "visualization: "+vizPath)
				}
				f.Close()
			}
		}
		r.add(v)
	}
	return r, verdict
}

// illegalExcerpt finds, key by key, the shortest prefix of the history
// that is already not linearizable and quotes its last operations.
func illegalExcerpt(ops []porcupine.Operation) []string {
	parts := lockModel.Partition(ops)
	for _, part := range parts {
		if porcupine.CheckOperationsTimeout(lockModel, part, 10*time.Second) != porcupine.Illegal {
			continue
		}
		lo, hi := 1, len(part)
		for lo < hi { // the shortest illegal prefix (by call order)
			mid := (lo + hi) / 2
			if porcupine.CheckOperationsTimeout(lockModel, part[:mid], 5*time.Second) == porcupine.Illegal {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		var out []string
		for _, op := range part[max(0, hi-6):hi] {
			out = append(out, fmt.Sprintf("%s client %d [%s, %s] %s", op.Input.(linInput).Key, op.ClientId,
				ms(time.Duration(op.Call)), ms(time.Duration(op.Return)), lockModel.DescribeOperation(op.Input, op.Output)))
		}
		return out
	}
	return nil
}
