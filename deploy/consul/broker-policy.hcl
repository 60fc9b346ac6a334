# Least-privilege Consul ACL policy for lockbroker's own token
# (CONSUL_HTTP_TOKEN of every broker replica), for a Consul whose ACLs are
# on with default_policy = "deny". See deploy/consul/README.md for how to
# create the policy and its token.
#
# Edit the tenant section so it lists exactly the prefixes of your
# tenants file, and nothing else.

# The broker's own keys: one record per session it granted holds to
# (lockbroker/sessions/<session id>), written in the same transaction as
# each grant and release. Tenants can never use this prefix.
key_prefix "lockbroker/" {
  policy = "write"
}

# ---- Tenant prefixes: one block per entry of `prefixes` in the tenants file.
# The broker reads these keys for every tenant (watches, GetLock,
# CheckSequencer, ForceRelease) and writes them for tenants without a
# consul_token_file of their own. Examples for the tenants file in README.md:
key_prefix "payments/" {
  policy = "write"
}
key_prefix "orders/" {
  policy = "write"
}
# ---- end of tenant prefixes

# Sessions: create, renew, read and destroy the sessions behind every hold.
# Consul checks session rules against the name of the node a session is
# bound to, which is the node of the Consul agent the broker talks to.
# To narrow this further, replace "" by the prefix those agents' node names
# share (e.g. session_prefix "broker-agent-").
session_prefix "" {
  policy = "write"
}

# Nothing else. Health (/v1/status/leader) needs no rule; the broker never
# reads the catalog, services, nodes, ACLs or agent endpoints.
