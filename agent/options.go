package agent

import (
	"fmt"
	"log/slog"
)

// Option configures a Server. A bad one is ErrInvalidOption.
type Option func(*Server) error

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *Server) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		s.logger = l
		return nil
	}
}

// WithSlotDir sets where slots are created (default: the store's directory
// plus ".slots"). It must be on the same tmpfs as the store to be cheap.
func WithSlotDir(dir string) Option {
	return func(s *Server) error {
		if dir == "" {
			return fmt.Errorf("%w: empty slot directory", ErrInvalidOption)
		}
		s.slotDir = dir
		return nil
	}
}

// WithMaxBody bounds request bodies (default 1 GiB): a commit of posted
// bytes or a key of a decoded tensor carries the data.
func WithMaxBody(n int64) Option {
	return func(s *Server) error {
		if n <= 0 {
			return fmt.Errorf("%w: max body %d: must be positive", ErrInvalidOption, n)
		}
		s.maxBody = n
		return nil
	}
}
