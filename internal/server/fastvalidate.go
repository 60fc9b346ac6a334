package server

import (
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// violation is one broken rule: the field path, the message and the rule
// id, as protovalidate words them.
type violation struct{ field, message, rule string }

// fastViolations checks the requests of the critical path (Acquire,
// TryAcquire, Release, SetValue) in plain Go, without protovalidate's CEL
// programs: the rules of the proto, in protovalidate's order and words
// (TestFastValidationMatchesProtovalidate holds them to it). ok is false
// for any other message; protovalidate checks those. A valid request
// allocates nothing.
func fastViolations(msg any) (vs []violation, ok bool) {
	switch m := msg.(type) {
	case *lockbrokerv1.AcquireRequest:
		if len(m.GetKeys()) > 0 {
			return nil, false // a multi-key lock: protovalidate checks `keys` (max_items, unique, each key)
		}
		vs = checkKey(vs, "", "key", m.GetKey())
		vs = checkValue(vs, "value", m.GetValue())
		vs = checkLimit(vs, m.GetLimit())
		if d := m.GetWaitTimeout(); d != nil {
			vs = checkDuration(vs, "", "wait_timeout", d, 0, 24*time.Hour, "0s", "86400s")
		}
		switch s := m.GetSession().(type) {
		case *lockbrokerv1.AcquireRequest_NewSession:
			vs = checkSessionOptions(vs, "new_session.", s.NewSession)
		case *lockbrokerv1.AcquireRequest_SessionId:
			vs = checkUUID(vs, "", "session_id", s.SessionId)
		case *lockbrokerv1.AcquireRequest_Resume:
			vs = checkSequencer(vs, "resume.", s.Resume)
		}
		vs = checkAcquireKind(vs, "kind", m.GetKind())
	case *lockbrokerv1.TryAcquireRequest:
		vs = checkKey(vs, "", "key", m.GetKey())
		vs = checkValue(vs, "value", m.GetValue())
		vs = checkLimit(vs, m.GetLimit())
		vs = checkUUID(vs, "", "session_id", m.GetSessionId())
		vs = checkAcquireKind(vs, "kind", m.GetKind())
	case *lockbrokerv1.ReleaseRequest:
		vs = checkKey(vs, "", "key", m.GetKey())
		vs = checkUUID(vs, "", "session_id", m.GetSessionId())
	case *lockbrokerv1.SetValueRequest:
		vs = checkKey(vs, "", "key", m.GetKey())
		vs = checkUUID(vs, "", "session_id", m.GetSessionId())
		vs = checkValue(vs, "value", m.GetValue())
	default:
		return nil, false
	}
	return vs, true
}

// maxKeyBytes and maxValueBytes are the proto's bounds (key.proto's
// lock_key, the value fields' bytes.max_len).
const (
	maxKeyBytes   = 512
	maxValueBytes = 262144
	maxLimit      = 1024
)

// checkKey applies key.proto's lock_key rules, in their order.
func checkKey(vs []violation, prefix, name, k string) []violation {
	if k != "" && len(k) <= maxKeyBytes && k[0] != '/' && k[len(k)-1] != '/' && !strings.Contains(k, "//") && !hasDotSegment(k) && !hasControl(k) && !hasNonPrinting(k) {
		return vs // the common case: no path string built
	}
	field := prefix + name
	if k == "" {
		vs = append(vs, violation{field, "must not be empty", "lock_key.empty"})
	}
	if len(k) > maxKeyBytes {
		vs = append(vs, violation{field, "must be at most 512 bytes, got " + strconv.Itoa(len(k)), "lock_key.too_long"})
	}
	if strings.HasPrefix(k, "/") {
		vs = append(vs, violation{field, `must not start with "/"`, "lock_key.leading_slash"})
	}
	if k != "" && (strings.HasSuffix(k, "/") || strings.Contains(k, "//")) {
		vs = append(vs, violation{field, `must not contain an empty segment ("//" or a trailing "/")`, "lock_key.empty_segment"})
	}
	if hasDotSegment(k) {
		vs = append(vs, violation{field, `must not contain a "." or ".." segment`, "lock_key.dot_segment"})
	}
	if hasControl(k) {
		vs = append(vs, violation{field, "must not contain control characters", "lock_key.control_character"})
	}
	if hasNonPrinting(k) {
		vs = append(vs, violation{field, "must not contain non-printing characters (Consul refuses them)", "lock_key.non_printing"})
	}
	return vs
}

// hasNonPrinting is the regular expression
// [^\p{L}\p{M}\p{N}\p{P}\p{S} \x00-\x1f\x7f]: a character that is not
// unicode.IsPrint (Consul's test of a request path), control characters
// aside (hasControl). ASCII is printable or control, so only multi-byte
// characters are decoded.
func hasNonPrinting(k string) bool {
	for i := 0; i < len(k); {
		if k[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(k[i:])
		if !unicode.IsPrint(r) {
			return true
		}
		i += n
	}
	return false
}

// hasDotSegment is the regular expression (^|/)[.][.]?(/|$).
func hasDotSegment(k string) bool {
	for rest := k; ; {
		seg, tail, more := strings.Cut(rest, "/")
		if seg == "." || seg == ".." {
			return true
		}
		if !more {
			return false
		}
		rest = tail
	}
}

// hasControl is the regular expression [\x00-\x1f\x7f] on valid UTF-8 (no
// byte of a multi-byte sequence is below 0x80).
func hasControl(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c == 0x7f {
			return true
		}
	}
	return false
}

func checkValue(vs []violation, field string, v []byte) []violation {
	if len(v) > maxValueBytes {
		vs = append(vs, violation{field, "must be at most 262144 bytes", "bytes.max_len"})
	}
	return vs
}

func checkLimit(vs []violation, limit uint32) []violation {
	if limit > maxLimit {
		vs = append(vs, violation{"limit", "must be less than or equal to 1024", "uint32.lte"})
	}
	return vs
}

// checkUUID is string.uuid (protovalidate's uuidRegexp).
func checkUUID(vs []violation, prefix, name, s string) []violation {
	switch {
	case s == "":
		return append(vs, violation{prefix + name, "value is empty, which is not a valid UUID", "string.uuid_empty"})
	case !isUUID(s):
		return append(vs, violation{prefix + name, "must be a valid UUID", "string.uuid"})
	}
	return vs
}

// isUUID is ^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// checkDuration is the duration gte/lte pair (rule duration.gte_lte);
// the CEL program compares the value as durationpb.AsDuration reads it.
func checkDuration(vs []violation, prefix, name string, d *durationpb.Duration, lo, hi time.Duration, loText, hiText string) []violation {
	if v := d.AsDuration(); v < lo || v > hi {
		vs = append(vs, violation{prefix + name, "must be greater than or equal to " + loText + " and less than or equal to " + hiText, "duration.gte_lte"})
	}
	return vs
}

func checkAcquireKind(vs []violation, field string, k lockbrokerv1.AcquireKind) []violation {
	if _, ok := lockbrokerv1.AcquireKind_name[int32(k)]; !ok {
		vs = append(vs, violation{field, "value must be one of the defined enum values", "enum.defined_only"})
	}
	return vs
}

// checkSessionOptions applies types.proto's SessionOptions rules; prefix
// is the path of the message ("new_session.").
func checkSessionOptions(vs []violation, prefix string, o *lockbrokerv1.SessionOptions) []violation {
	if d := o.GetTtl(); d != nil {
		vs = checkDuration(vs, prefix, "ttl", d, 10*time.Second, 24*time.Hour, "10s", "86400s")
	}
	if d := o.GetLockDelay(); d != nil {
		vs = checkDuration(vs, prefix, "lock_delay", d, 0, time.Minute, "0s", "60s")
	}
	if _, ok := lockbrokerv1.SessionBehavior_name[int32(o.GetBehavior())]; !ok {
		vs = append(vs, violation{prefix + "behavior", "value must be one of the defined enum values", "enum.defined_only"})
	}
	checks := o.GetChecks()
	if len(checks) > 16 {
		vs = append(vs, violation{prefix + "checks", "must contain no more than 16 item(s)", "repeated.max_items"})
	}
	for i, c := range checks {
		n := utf8.RuneCountInString(c)
		if n < 1 {
			vs = append(vs, violation{prefix + "checks[" + strconv.Itoa(i) + "]", "must be at least 1 characters", "string.min_len"})
		}
		if n > 256 {
			vs = append(vs, violation{prefix + "checks[" + strconv.Itoa(i) + "]", "must be at most 256 characters", "string.max_len"})
		}
	}
	if len(o.GetName()) > 128 {
		vs = append(vs, violation{prefix + "name", "must be at most 128 bytes", "string.max_bytes"})
	}
	return vs
}

// checkSequencer applies types.proto's Sequencer rules; prefix is the
// path of the message ("resume.").
func checkSequencer(vs []violation, prefix string, s *lockbrokerv1.Sequencer) []violation {
	vs = checkKey(vs, prefix, "key", s.GetKey())
	return checkUUID(vs, prefix, "session_id", s.GetSessionId())
}
