package tenant

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// LineError is one mistake in the tenants file.
type LineError struct {
	File string
	Line int
	Msg  string
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// maxPrefixBytes is the longest prefix: the longest key.
const maxPrefixBytes = 512

// nameRE is a tenant name: it becomes a metrics label value and is
// recorded in Consul, so it stays short and plain.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// parser collects the mistakes of one file.
type parser struct {
	file     string
	readFile func(string) ([]byte, error)
	errs     []error
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.errs = append(p.errs, &LineError{File: p.file, Line: n.Line, Msg: fmt.Sprintf(format, args...)})
}

// Parse checks the contents of a tenants file. name is the file's path
// (for errors and to resolve relative consul_token_file paths); readFile
// reads the Consul token files. Every mistake is reported, each with its
// line; the error is nil only when the whole file is good.
func Parse(name string, data []byte, readFile func(string) ([]byte, error)) (*Config, error) {
	p := &parser{file: name, readFile: readFile}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, &LineError{File: name, Line: 1, Msg: "empty file: want `tenants:` and `admins:`"}
	}
	c := &Config{Path: name, byName: map[string]*Tenant{}, exact: map[string]*Tenant{}, admins: map[string]bool{}}
	p.document(c, doc.Content[0])
	if len(p.errs) == 0 && len(c.Tenants) == 0 && len(c.Admins) == 0 {
		p.errorf(doc.Content[0], "no tenants and no admins")
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return c, nil
}

// document reads the top-level mapping.
func (p *parser) document(c *Config, root *yaml.Node) {
	fields := p.mapping(root, "the file", "tenants", "admins")
	if n := fields["tenants"]; n != nil {
		for _, item := range p.sequence(n, "tenants") {
			if t := p.tenant(item); t != nil {
				p.addTenant(c, t, item)
			}
		}
	}
	if n := fields["admins"]; n != nil {
		seen := map[string]int{}
		for _, item := range p.sequence(n, "admins") {
			s, ok := p.str(item, "admin identity")
			if !ok {
				continue
			}
			id, err := ParseIdentity(s)
			if err != nil {
				p.errorf(item, "admins: %v", err)
				continue
			}
			if line, dup := seen[id]; dup {
				p.errorf(item, "admins: %s is already listed on line %d", id, line)
				continue
			}
			seen[id] = item.Line
			c.Admins = append(c.Admins, id)
			c.admins[id] = true
			if strings.HasPrefix(id, KindToken) {
				c.adminTokens = append(c.adminTokens, newTokenEntry(id, nil))
			}
		}
	}
}

// tenant reads one tenant; nil when it is unusable.
func (p *parser) tenant(n *yaml.Node) *Tenant {
	fields := p.mapping(n, "a tenant", "name", "identities", "prefixes", "max_holds", "max_sessions", "acquire_rate",
		"write_rate", "write_bytes_rate", "read_rate", "consul_token_file")
	if fields == nil {
		return nil
	}
	t := &Tenant{Line: n.Line}
	before := len(p.errs)
	if f := fields["name"]; f == nil {
		p.errorf(n, "tenant without a name")
	} else if s, ok := p.str(f, "name"); ok {
		if !nameRE.MatchString(s) {
			p.errorf(f, "tenant name %q: want 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit", s)
		}
		t.Name = s
	}
	what := fmt.Sprintf("tenant %q", t.Name)
	if f := fields["identities"]; f == nil {
		p.errorf(n, "%s: no identities", what)
	} else {
		items := p.sequence(f, "identities")
		for _, item := range items {
			if s, ok := p.str(item, "identity"); ok {
				id, err := ParseIdentity(s)
				if err != nil {
					p.errorf(item, "%s: %v", what, err)
					continue
				}
				t.Identities = append(t.Identities, id)
			}
		}
		if len(items) == 0 && (f.Kind == yaml.SequenceNode || f.Tag == "!!null") {
			p.errorf(f, "%s: no identities", what)
		}
	}
	if f := fields["prefixes"]; f == nil {
		p.errorf(n, "%s: no prefixes", what)
	} else {
		items := p.sequence(f, "prefixes")
		for _, item := range items {
			if s, ok := p.str(item, "prefix"); ok {
				if err := checkPrefix(s); err != nil {
					p.errorf(item, "%s: prefix %q: %v", what, s, err)
					continue
				}
				t.Prefixes = append(t.Prefixes, s)
			}
		}
		if len(items) == 0 && (f.Kind == yaml.SequenceNode || f.Tag == "!!null") {
			p.errorf(f, "%s: no prefixes", what)
		}
	}
	if f := fields["max_holds"]; f != nil {
		t.MaxHolds = p.count(f, what+": max_holds")
	}
	if f := fields["max_sessions"]; f != nil {
		t.MaxSessions = p.count(f, what+": max_sessions")
	}
	for _, r := range []struct {
		name string
		to   *float64
	}{{"acquire_rate", &t.AcquireRate}, {"write_rate", &t.WriteRate}, {"write_bytes_rate", &t.WriteBytesRate}, {"read_rate", &t.ReadRate}} {
		if f := fields[r.name]; f != nil {
			*r.to = p.rate(f, what+": "+r.name)
		}
	}
	if f := fields["consul_token_file"]; f != nil {
		if s, ok := p.str(f, "consul_token_file"); ok && s != "" {
			t.ConsulTokenFile = s
			t.ConsulToken = p.token(f, what, s)
		}
	}
	if len(p.errs) > before {
		return nil
	}
	return t
}

// addTenant adds t, refusing a second tenant of the same name and an
// identity that already belongs to a tenant.
func (p *parser) addTenant(c *Config, t *Tenant, n *yaml.Node) {
	if old := c.byName[t.Name]; old != nil {
		p.errorf(n, "tenant %q is already defined on line %d", t.Name, old.Line)
		return
	}
	for _, id := range t.Identities {
		if old := c.owner(id); old != nil {
			p.errorf(n, "tenant %q: identity %s already belongs to tenant %q (line %d)", t.Name, id, old.Name, old.Line)
			return
		}
		if strings.HasPrefix(id, KindToken) {
			c.tokens = append(c.tokens, newTokenEntry(id, t))
		} else {
			c.exact[id] = t
		}
	}
	if p.overlaps(c, t, n) {
		return
	}
	c.byName[t.Name] = t
	c.Tenants = append(c.Tenants, t)
}

// overlaps reports (and refuses) a prefix of t that overlaps a prefix of
// a tenant already added: a key such as the longer one would belong to
// both tenants ("pay" and "payroll/"). Prefixes of one tenant may overlap.
func (p *parser) overlaps(c *Config, t *Tenant, n *yaml.Node) bool {
	found := false
	for _, old := range c.Tenants {
		for _, a := range t.Prefixes {
			for _, b := range old.Prefixes {
				if strings.HasPrefix(a, b) || strings.HasPrefix(b, a) {
					p.errorf(n, "tenant %q: prefix %q overlaps prefix %q of tenant %q (line %d): a key starting with %q would belong to both",
						t.Name, a, b, old.Name, old.Line, longer(a, b))
					found = true
				}
			}
		}
	}
	return found
}

func longer(a, b string) string {
	if len(a) > len(b) {
		return a
	}
	return b
}

// checkPrefix refuses prefixes no key could use safely: empty ones (every
// key), those that overlap the broker's own keys, and those no valid key
// can start with.
func checkPrefix(s string) error {
	switch {
	case s == "":
		return errors.New("empty (it would allow every key, the broker's own included)")
	case strings.HasPrefix(s, broker.BrokerPrefix) || strings.HasPrefix(broker.BrokerPrefix, s):
		return fmt.Errorf("overlaps the broker's own prefix %q", broker.BrokerPrefix)
	case len(s) > maxPrefixBytes:
		return fmt.Errorf("longer than %d bytes", maxPrefixBytes)
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.HasPrefix(s, "/"):
		return errors.New(`starts with "/" (keys never do)`)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return errors.New("contains a control character")
		}
	}
	return nil
}

// token reads a tenant's Consul token file. Neither its contents nor its
// path (which may be a token pasted in its place) appear in an error.
func (p *parser) token(n *yaml.Node, what, path string) Secret {
	if !filepath.IsAbs(path) {
		path = filepath.Join(filepath.Dir(p.file), path)
	}
	data, err := p.readFile(path)
	if err != nil {
		// The path is not shown: a token pasted here instead of a path
		// must not reach a log. The line says which file.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		p.errorf(n, "%s: consul_token_file (path not shown, %d characters): cannot read it: %v; want the path of a file holding the token, not the token", what, len(path), err)
		return ""
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" || strings.ContainsAny(tok, "\r\n\t ") {
		p.errorf(n, "%s: consul_token_file: the file holds %s: want one token on one line", what, tokenShape(tok))
		return ""
	}
	return Secret(tok)
}

// tokenShape says what is wrong with a token file's contents without them.
func tokenShape(tok string) string {
	if tok == "" {
		return "nothing"
	}
	return fmt.Sprintf("%d lines or words", len(strings.Fields(tok)))
}

// mapping checks that n is a mapping with only the given keys, each once,
// and returns the value node of each key present (nil when n is not a
// mapping).
func (p *parser) mapping(n *yaml.Node, what string, keys ...string) map[string]*yaml.Node {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s: want a mapping with keys %s", what, strings.Join(keys, ", "))
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		known := false
		for _, want := range keys {
			known = known || k.Value == want
		}
		switch {
		case !known:
			p.errorf(k, "%s: unknown key %q (want %s)", what, k.Value, strings.Join(keys, ", "))
		case out[k.Value] != nil:
			p.errorf(k, "%s: key %q given twice", what, k.Value)
		default:
			out[k.Value] = v
		}
	}
	return out
}

// sequence returns n's items, or reports that it is not a list.
func (p *parser) sequence(n *yaml.Node, what string) []*yaml.Node {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n, "%s: want a list", what)
		return nil
	}
	return n.Content
}

// str returns a string scalar.
func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		p.errorf(n, "%s: want a string (quote it)", what)
		return "", false
	}
	return n.Value, true
}

// count returns a non-negative integer scalar.
func (p *parser) count(n *yaml.Node, what string) int {
	v, err := strconv.Atoi(n.Value)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || err != nil || v < 0 {
		p.errorf(n, "%s: want a whole number, 0 or more (0: no limit), got %q", what, n.Value)
		return 0
	}
	return v
}

// rate returns a non-negative number scalar.
func (p *parser) rate(n *yaml.Node, what string) float64 {
	v, err := strconv.ParseFloat(n.Value, 64)
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") || err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		p.errorf(n, "%s: want a number of calls per second, 0 or more (0: no limit), got %q", what, n.Value)
		return 0
	}
	return v
}
