package service

import (
	"context"
	"errors"
	"strings"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/store"
	"go.opentelemetry.io/otel/metric"
)

// The event log's consumers. One follower (Observe) reads the store's
// whole log, from its oldest retained event, and hands every event in log
// order to each consumer by name:
//
//   - admission: admission control counts what the log shows held
//     (pending retries, open chains, active sessions), when a FailedStep
//     bound is set;
//   - fleet: fleet protection takes a retry that started or was cancelled
//     out of its provider's queue;
//   - telemetry: counts starts and cancellations, records the start
//     lateness and ends the retries' backoff spans.
//
// No consumer rides on another: each sees the log only through the
// follower.

// logConsumer is one part of the service that follows the event log.
type logConsumer struct {
	name    string
	observe func(context.Context, *retrydv1.Event)
}

// consumers are the event log's consumers, in the order each event is
// handed to them.
func (s *Service) consumers() []logConsumer {
	var cs []logConsumer
	if s.adm.Tracks() {
		cs = append(cs, logConsumer{"admission", func(_ context.Context, ev *retrydv1.Event) { s.adm.Observe(ev) }})
	}
	return append(cs, logConsumer{"telemetry", s.tel.Observe})
}

// observeRetryDelay is how long Observe waits before it follows the log
// again after the store was unavailable.
const observeRetryDelay = time.Second

// Observe follows the store's event log for its consumers (see
// consumers). Run it in one goroutine for the server's life; it returns
// when ctx ends or the store closes. When the store is unavailable for a
// while, it follows the log again from where it stopped.
func (s *Service) Observe(ctx context.Context) error {
	cs := s.consumers()
	s.tel.began = time.Now()
	err := s.follow(ctx, cs)
	s.tel.endAll()
	if errors.Is(err, context.Canceled) || errors.Is(err, store.ErrShutdown) {
		return nil
	}
	return err
}

// follow hands every event of the log to each of cs until ctx ends or the
// store closes.
func (s *Service) follow(ctx context.Context, cs []logConsumer) error {
	var after uint64
	for {
		err := s.store.WatchEvents(ctx, &retrydv1.WatchEventsRequest{AfterSequence: after}, func(ev *retrydv1.Event) error {
			for _, c := range cs {
				c.observe(ctx, ev)
			}
			after = max(after, ev.GetSequence())
			return nil
		})
		if !errors.Is(err, store.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		names := make([]string, len(cs))
		for i, c := range cs {
			names[i] = c.name
		}
		s.log.Warn("following the event log failed; its consumers wait for it", "err", err,
			"consumers", strings.Join(names, ","), "after_sequence", after, "retry_in", observeRetryDelay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(observeRetryDelay):
		}
	}
}

// meterOf is the meter of the service's instruments, nil without a meter
// provider.
func meterOf(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		return nil
	}
	return mp.Meter(instrumentationName)
}
