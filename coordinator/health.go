package coordinator

import (
	"context"
	"fmt"
)

// storeReachable reports whether the bucket is open and the connection is
// up. The bucket stays open across reconnects, so the first alone would
// say yes while the server is gone.
func (c *Cache) storeReachable() bool {
	b := c.bucket()
	return b != nil && c.nc.IsConnected()
}

// Ping reports whether the store is usable now: the bucket is open, the
// connection is up, and the server answers a round trip before ctx ends
// (ctx must carry a deadline). The round trip is what notices a server
// gone without closing the connection. After Close has begun, or cancelled
// by it, it is ErrClosed (wrapped).
func (c *Cache) Ping(ctx context.Context) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	ctx, cancel := c.bind(ctx)
	defer cancel()
	return closedErr(ctx, c.ping(ctx))
}

func (c *Cache) ping(ctx context.Context) error {
	if !c.storeReachable() {
		return fmt.Errorf("%w: %s: not connected", ErrStoreUnavailable, serverNames(c.nc))
	}
	if err := c.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, serverNames(c.nc), err)
	}
	return nil
}
