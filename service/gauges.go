package service

import (
	"context"

	"github.com/retryd/retryd/store"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

func registerStoreGauges(mp metric.MeterProvider, b store.Backend) error {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	if src, ok := b.(store.DamagedTimerSource); ok {
		postponed, err := m.Int64ObservableCounter("retryd.timers.postponed", metric.WithUnit("{timer}"),
			metric.WithDescription("Due timers postponed because their session's stored data did not decode."))
		if err != nil {
			return err
		}
		if _, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(postponed, src.TimersPostponed())
			return nil
		}, postponed); err != nil {
			return err
		}
	}
	src := b
	sessions, err := m.Int64ObservableGauge("retryd.sessions", metric.WithUnit("{session}"),
		metric.WithDescription("Sessions the store holds."))
	if err != nil {
		return err
	}
	chains, err := m.Int64ObservableGauge("retryd.chains.open", metric.WithUnit("{chain}"),
		metric.WithDescription("Open retry chains."))
	if err != nil {
		return err
	}
	pending, err := m.Int64ObservableGauge("retryd.retries.pending", metric.WithUnit("{retry}"),
		metric.WithDescription("Scheduled retries that have neither started nor been cancelled."))
	if err != nil {
		return err
	}
	awaiters, err := m.Int64ObservableGauge("retryd.awaiters", metric.WithUnit("{stream}"),
		metric.WithDescription("Connected AwaitRetry streams."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := src.Stats()
		o.ObserveInt64(sessions, st.Sessions)
		o.ObserveInt64(chains, st.OpenChains)
		o.ObserveInt64(pending, st.PendingRetries)
		o.ObserveInt64(awaiters, st.Awaiters)
		return nil
	}, sessions, chains, pending, awaiters)
	return err
}
