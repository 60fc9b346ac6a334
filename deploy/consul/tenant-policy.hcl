# Consul ACL policy for one tenant's own token (consul_token_file in the
# tenants file), here for the tenant "payments" with prefixes
# ["payments/"]. Copy it per tenant and change the tenant's prefixes.
#
# With a consul_token_file, every Consul call a tenant's hold makes (its
# session, the grant, renewals, the release) uses the tenant's token, so
# Consul itself refuses keys outside these prefixes even if the broker
# had a bug.

# The tenant's keys.
key_prefix "payments/" {
  policy = "write"
}

# The broker's session records: the transaction that grants (or releases)
# a hold also writes the record of the hold's session, with the tenant's
# token. Consul cannot scope this to the tenant's own records (they are
# keyed by session id), see README.md.
key_prefix "lockbroker/sessions/" {
  policy = "write"
}

# The tenant's sessions (bound to the node of the broker's Consul agent;
# narrow "" to that node name prefix if you can).
session_prefix "" {
  policy = "write"
}
