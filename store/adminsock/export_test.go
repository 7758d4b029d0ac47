package adminsock

import "context"

// Call posts op with no arguments (for tests of what the server refuses).
func Call(ctx context.Context, c *Client, op string) error { return c.call(ctx, op, args{}, nil) }
