package consultest

import (
	"testing"

	"github.com/hashicorp/consul/api"
)

// ManagementToken is the initial management token of agents started by
// StartACL (a test-only value).
const ManagementToken = "3f1c2a9e-8b7d-4c6e-a5f4-0d9e8c7b6a51"

// StartACL starts an agent (see Start) whose ACLs are on with
// default_policy "deny": a request without a token, or with a token
// whose policies do not allow it, is refused. ManagementConfig carries
// the management token; CreateToken makes tokens with given rules.
func StartACL(t testing.TB, opts ...Option) *Agent {
	t.Helper()
	opts = append([]Option{
		WithHCL(`acl { enabled = true  default_policy = "deny"  enable_token_persistence = false  tokens { initial_management = "` + ManagementToken + `" } }`),
		func(c *ProcessConfig) { c.Token = ManagementToken },
	}, opts...)
	return Start(t, opts...)
}

// ManagementConfig is Config with the management token of an agent
// started by StartACL ("" for other agents).
func (a *Agent) ManagementConfig() *api.Config {
	cfg := a.Config()
	cfg.Token = a.token
	return cfg
}

// CreateToken creates an ACL policy called name with rules (Consul's
// HCL rules language) and a token holding only that policy, and returns
// the token's secret. With empty rules the token has no policy: it can do
// nothing beyond what anonymous requests may. It calls t.Fatal on error.
func (a *Agent) CreateToken(t testing.TB, name, rules string) string {
	t.Helper()
	c, err := api.NewClient(a.ManagementConfig())
	if err != nil {
		t.Fatalf("consultest: api client: %v", err)
	}
	tok := &api.ACLToken{Description: name}
	if rules != "" {
		p, _, err := c.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
		if err != nil {
			t.Fatalf("consultest: create policy %s: %v", name, err)
		}
		tok.Policies = []*api.ACLTokenPolicyLink{{ID: p.ID}}
	}
	created, _, err := c.ACL().TokenCreate(tok, nil)
	if err != nil {
		t.Fatalf("consultest: create token %s: %v", name, err)
	}
	return created.SecretID
}

// LogPath is the file that holds the agent's output.
func (a *Agent) LogPath() string { return a.logPath }
