package redis

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// SetLogger sends go-redis' own messages (a failed dial, a broken pool
// connection while Redis is away) to log as warnings, so that a JSON log
// stays JSON. go-redis keeps one logger for the whole process.
func SetLogger(log *slog.Logger) { redis.SetLogger(printfLogger{log}) }

// printfLogger adapts slog to go-redis' Printf-style logging.
type printfLogger struct{ log *slog.Logger }

func (l printfLogger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	l.log.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
