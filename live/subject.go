package live

import "strings"

// Prefix starts every summary's subject.
const Prefix = "embcache.sum."

// AllTenants is the subject's tenant token of a process that serves every
// tenant of its NATS account (no tenant is named "~": tenants are
// [A-Za-z0-9_-]).
const AllTenants = "~"

// Subject is the subject a process publishes its summaries on:
// embcache.sum.<tenant>.<node>.<id>, with AllTenants for tenant "" and
// the node's name as a token (bytes outside [A-Za-z0-9_-] as "_"; the
// body has the name as it is).
func Subject(tenant, node, id string) string {
	if tenant == "" {
		tenant = AllTenants
	}
	return Prefix + tenant + "." + token(node) + "." + token(id)
}

// TenantSubjects is what an aggregator subscribes to: every summary, or
// those of one tenant's processes.
func TenantSubjects(tenant string) string {
	if tenant == "" {
		return Prefix + ">"
	}
	return Prefix + tenant + ".>"
}

// token makes s one subject token.
func token(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, s)
}
