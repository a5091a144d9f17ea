package store

import "context"

// tenantKey is the context key of WithTenant.
type tenantKey struct{}

// WithTenant returns ctx carrying the tenant that the store work done
// for ctx is shared by (the gate's fairness key). The handler sets the
// verified audience; it is kept in memory only, never logged or used as
// a metrics label. Every granted request makes one, so it is one
// allocation (context.WithValue would box the string in a second).
func WithTenant(ctx context.Context, tenant string) context.Context {
	return &tenantCtx{Context: ctx, tenant: tenant}
}

// tenantCtx is WithTenant's context: ctx and the tenant. Its Value
// answers tenantKey with a *string to the field, which boxes nothing.
type tenantCtx struct {
	context.Context
	tenant string
}

func (c *tenantCtx) Value(key any) any {
	if _, ok := key.(tenantKey); ok {
		return &c.tenant
	}
	return c.Context.Value(key)
}

// TenantOf returns the tenant WithTenant set on ctx ("" when none: such
// work shares one tenant).
func TenantOf(ctx context.Context) string {
	if p, ok := ctx.Value(tenantKey{}).(*string); ok {
		return *p
	}
	return ""
}
