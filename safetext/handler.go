package safetext

import (
	"context"
	"fmt"
	"log/slog"
)

// Handler wraps h so that every record's message, attribute keys and
// values (strings, errors, fmt.Stringers and string slices, inside
// groups too) pass through Clean before h sees them. Wrapping a Handler again
// returns it as it is.
func Handler(h slog.Handler) slog.Handler {
	if _, ok := h.(handler); ok {
		return h
	}
	return handler{h}
}

type handler struct{ h slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	c := slog.NewRecord(r.Time, r.Level, Clean(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		c.AddAttrs(cleanAttr(a))
		return true
	})
	return h.h.Handle(ctx, c)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	return handler{h.h.WithAttrs(cleanAttrs(as))}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.h.WithGroup(Clean(name))} }

func cleanAttrs(as []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = cleanAttr(a)
	}
	return out
}

func cleanAttr(a slog.Attr) slog.Attr {
	k, v := Clean(a.Key), a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(k, Clean(v.String()))
	case slog.KindGroup:
		return slog.Attr{Key: k, Value: slog.GroupValue(cleanAttrs(v.Group())...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(k, Clean(x.Error()))
		case fmt.Stringer:
			return slog.String(k, Clean(x.String()))
		case []string:
			c := make([]string, len(x))
			for i, s := range x {
				c[i] = Clean(s)
			}
			return slog.Any(k, c)
		}
	}
	return slog.Attr{Key: k, Value: v}
}
