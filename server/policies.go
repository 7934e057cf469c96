package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/retryd/retryd/config"
	"github.com/retryd/retryd/internal/reload"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// minConfigReloadInterval bounds how often the policy file is read.
const minConfigReloadInterval = 100 * time.Millisecond

// policySource serves the policies of the policy file and reloads them
// when the file's content changes (polling, see internal/reload: it sees
// Kubernetes' "..data" symlink swap of a mounted ConfigMap). New content
// that does not validate, or that changes a fleet block (fleet protection
// is built once, at start), is refused: the refusal is logged with the
// field it names and counted, and the last good policies keep deciding.
type policySource struct {
	src *reload.Source[[]byte, config.Policies]

	mu      sync.Mutex
	loaded  time.Time // last successful load
	digest  string    // its content's SHA-256, hex
	results map[string]int64
}

// newPolicySource loads the file once; an unreadable or invalid file
// refuses the start.
func newPolicySource(path string, log *slog.Logger) (*policySource, error) {
	ps := &policySource{results: map[string]int64{}}
	var start *config.Policies
	var pending string // the digest of the content being built
	src, err := reload.New(reload.Config[[]byte, config.Policies]{
		Read: func() ([]byte, [sha256.Size]byte, error) {
			data, err := os.ReadFile(path)
			if err != nil {
				err = fmt.Errorf("config: %w", err)
			}
			return data, sha256.Sum256(data), err
		},
		Build: func(data []byte) (*config.Policies, []any, error) {
			p, err := config.Parse(data)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
			if start == nil {
				start = p
			} else if field := start.FleetChange(p); field != "" {
				return nil, nil, fmt.Errorf("%s: %w", path, &config.FieldError{Field: field,
					Message: "fleet protection is set at start; restart retryd to change it"})
			}
			sum := sha256.Sum256(data)
			pending = hex.EncodeToString(sum[:])
			return p, []any{"file", path, "sha256", pending[:16],
				"named_policies", len(p.Names()), "provider_policies", len(p.Providers())}, nil
		},
		Log:      log,
		Loaded:   "policy file loaded",
		Reloaded: "policy file reloaded; new failures are decided with it",
		Failed:   "policy file reload refused; the last good policies keep deciding",
		Attrs:    []any{"file", path},
		Describe: func(err error) []any {
			var fe *config.FieldError
			if errors.As(err, &fe) {
				return []any{"field", fe.Field}
			}
			return nil
		},
		Result: func(err error) { ps.result(err, pending) },
	})
	if err != nil {
		return nil, err
	}
	ps.src = src
	ps.result(nil, pending)
	ps.results = map[string]int64{} // the first load is not a reload
	return ps, nil
}

func (ps *policySource) result(err error, digest string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if err != nil {
		ps.results["refused"]++
		return
	}
	ps.results["applied"]++
	ps.loaded, ps.digest = time.Now(), digest
}

// Current returns the policies in force.
func (ps *policySource) Current() *config.Policies { return ps.src.Current() }

// watch reloads every interval until ctx is done; the returned channel
// closes when it has stopped.
func (ps *policySource) watch(ctx context.Context, interval time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		ps.src.Watch(ctx, interval)
	}()
	return done
}

// registerMetrics exports retryd.config.reload (reloads that tried new
// content, by result: applied or refused) and retryd.config.loaded (the
// Unix time of the last successful load, with the SHA-256 of the file
// it loaded, so replicas serving different files show apart).
func (ps *policySource) registerMetrics(mp metric.MeterProvider) error {
	m := mp.Meter("github.com/retryd/retryd/server")
	reloads, err := m.Int64ObservableCounter("retryd.config.reload",
		metric.WithDescription("Reloads of the policy file that tried new content, by result (applied, refused)."),
		metric.WithUnit("{reload}"))
	if err != nil {
		return err
	}
	loaded, err := m.Float64ObservableGauge("retryd.config.loaded",
		metric.WithDescription("Unix time of the last successful load of the policy file, with its content's SHA-256 (config.sha256)."),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, r := range []string{"applied", "refused"} {
			o.ObserveInt64(reloads, ps.results[r], metric.WithAttributes(attribute.String("result", r)))
		}
		o.ObserveFloat64(loaded, float64(ps.loaded.UnixNano())/1e9,
			metric.WithAttributes(attribute.String("config.sha256", ps.digest)))
		return nil
	}, reloads, loaded)
	return err
}

// closedChan returns a closed channel: a watch that never started.
func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
