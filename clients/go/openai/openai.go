package retrydopenai

import (
	"net/http"

	"github.com/openai/openai-go/v3/option"
)

// Middleware returns the openai-go middleware of the Retrier. Use it with
// the SDK's own retries off, as RequestOptions does.
func (r *Retrier) Middleware() option.Middleware {
	return func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		return r.Do(req, next)
	}
}

// RequestOptions are the openai-go options that hand retries to retryd:
// the SDK's own retries off (option.WithMaxRetries(0)) and the Retrier's
// middleware. Pass them to openai.NewClient.
func (r *Retrier) RequestOptions() []option.RequestOption {
	return []option.RequestOption{option.WithMaxRetries(0), option.WithMiddleware(r.Middleware())}
}
