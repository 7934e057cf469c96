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
// field it names and counted, and the last good policies keep deciding;
// until the file validates again the source is not current (see
// setCurrentHook), which health service ConfigHealthService and metric
// retryd.config.last_reload.successful report.
type policySource struct {
	src *reload.Source[[]byte, config.Policies]

	mu      sync.Mutex
	loaded  time.Time // last successful load
	digest  string    // its content's SHA-256, hex
	results map[string]int64
	// current is false while the file on disk is not what decides: its
	// last content was refused, or it could not be read.
	current bool
	// currentHook, when set, is told every change of current.
	currentHook func(current bool)
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
		ps.setCurrent(false)
		return
	}
	ps.results["applied"]++
	ps.loaded, ps.digest = time.Now(), digest
	ps.setCurrent(true)
}

// setCurrent records whether the file on disk is what decides and tells
// the hook when that changes. Called with mu held.
func (ps *policySource) setCurrent(current bool) {
	if ps.current == current {
		return
	}
	ps.current = current
	if ps.currentHook != nil {
		ps.currentHook(current)
	}
}

// setCurrentHook sets the function told every change of whether the file
// on disk is what decides, and tells it the state now.
func (ps *policySource) setCurrentHook(hook func(current bool)) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.currentHook = hook
	hook(ps.current)
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
// content, by result: applied or refused), retryd.config.loaded (the
// Unix time of the last successful load, with the SHA-256 of the file
// it loaded, so replicas serving different files show apart) and
// retryd.config.last_reload.successful (1 while the file on disk is what
// decides, 0 while its content is refused or it cannot be read).
func (ps *policySource) registerMetrics(mp metric.MeterProvider) error {
	m := mp.Meter("github.com/retryd/retryd/server")
	reloads, err := m.Int64ObservableCounter("retryd.config.reload",
		metric.WithDescription("Reloads of the policy file that tried new content, by result (applied, refused)."),
		metric.WithUnit("{reload}"))
	if err != nil {
		return err
	}
	loaded, err := m.Float64ObservableGauge("retryd.config.loaded",
		metric.WithDescription("Unix time of the last successful load of the policy file, with its content's SHA-256 (retryd.config.sha256)."),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	successful, err := m.Int64ObservableGauge("retryd.config.last_reload.successful",
		metric.WithDescription("1 while the policy file on disk is what decides; 0 while its content is refused (the last good policies keep deciding)."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		for _, r := range []string{"applied", "refused"} {
			o.ObserveInt64(reloads, ps.results[r], metric.WithAttributes(attribute.String("retryd.config.reload.result", r)))
		}
		o.ObserveFloat64(loaded, float64(ps.loaded.UnixNano())/1e9,
			metric.WithAttributes(attribute.String("retryd.config.sha256", ps.digest)))
		var ok int64
		if ps.current {
			ok = 1
		}
		o.ObserveInt64(successful, ok)
		return nil
	}, reloads, loaded, successful)
	return err
}

// closedChan returns a closed channel: a watch that never started.
func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
