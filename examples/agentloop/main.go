// Command agentloop is a small agent loop that talks to retryd: each user
// turn sends model requests to a fake, scripted provider, reports every
// failure with the Go client's Recover, waits for the retry's Started and
// tries again, until the provider answers or retryd delegates.
//
// It exports traces through the standard OTEL_* variables (the same setup
// as retryd), so one logical turn shows up in Jaeger as one trace: the
// turn span, an attempt span per model request, and retryd's decision and
// backoff spans inside it, each retry attempt parented to the backoff span
// that ended with its Started.
//
//	agentloop --retryd 127.0.0.1:7700 --script 503,429@1500,ok
//
// The script is the provider's answers in order: an HTTP status (503, 429,
// 500, …), optionally with "@ms" for a Retry-After in milliseconds, or
// "ok". The loop repeats it for --turns turns.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	retryd "github.com/retryd/retryd/clients/go"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/telemetry"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
}

// answer is one scripted provider response.
type answer struct {
	status       int   // 0: success
	retryAfterMs int64 // -1: none
}

func parseScript(s string) ([]answer, error) {
	var out []answer
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "ok" {
			out = append(out, answer{retryAfterMs: -1})
			continue
		}
		code, ra, hasRA := strings.Cut(f, "@")
		status, err := strconv.Atoi(code)
		if err != nil || status < 400 || status > 599 {
			return nil, fmt.Errorf("script entry %q: want ok, an HTTP error status, or status@retryAfterMs", f)
		}
		a := answer{status: status, retryAfterMs: -1}
		if hasRA {
			if a.retryAfterMs, err = strconv.ParseInt(ra, 10, 64); err != nil || a.retryAfterMs < 0 {
				return nil, fmt.Errorf("script entry %q: bad retry-after milliseconds", f)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// provider is the fake flaky model provider.
type provider struct {
	script []answer
	next   int
}

func (p *provider) call(ctx context.Context) (answer, error) {
	a := p.script[p.next%len(p.script)]
	p.next++
	select { // a model request takes a moment
	case <-time.After(20 * time.Millisecond):
	case <-ctx.Done():
		return answer{}, ctx.Err()
	}
	return a, nil
}

// failureOf classifies an HTTP status the way a provider adapter does.
func failureOf(a answer) *retrydv1.Failure {
	f := &retrydv1.Failure{HttpStatus: uint32(a.status), Message: fmt.Sprintf("provider answered HTTP %d", a.status)}
	switch {
	case a.status == 429:
		f.Code = "RATE_LIMIT"
	case a.status >= 500:
		f.Code = "SERVER"
	default:
		f.Code = fmt.Sprintf("HTTP_%d", a.status)
	}
	if a.retryAfterMs >= 0 {
		f.ProviderRetryAfterMs = proto.Int64(a.retryAfterMs)
	}
	return f
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("agentloop", flag.ContinueOnError)
	addr := fs.String("retryd", "127.0.0.1:7700", "retryd address")
	script := fs.String("script", "503,429@1500,ok", "the provider's answers, in order")
	turns := fs.Int("turns", 1, "user turns to run")
	session := fs.String("session", fmt.Sprintf("agentloop-%d", time.Now().UnixNano()), "session id")
	providerName := fs.String("provider", "flaky", "provider name reported to retryd")
	if err := fs.Parse(args); err != nil {
		return err
	}
	answers, err := parseScript(*script)
	if err != nil {
		return err
	}

	tel, err := telemetry.Setup(ctx, "example", getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	client, err := retryd.New(*addr, retryd.WithInsecure(), retryd.WithTracerProvider(tel.Tracer))
	if err != nil {
		return err
	}
	defer client.Close()

	loop := &agentLoop{
		client:   client,
		provider: &provider{script: answers},
		tracer:   tel.Tracer.Tracer("github.com/retryd/retryd/examples/agentloop"),
		session:  *session,
		name:     *providerName,
		out:      stdout,
	}
	for i := 1; i <= *turns; i++ {
		if err := loop.runTurn(ctx, fmt.Sprintf("%s/turn-%d", *session, i)); err != nil {
			return err
		}
	}
	return nil
}

type agentLoop struct {
	client     *retryd.Client
	provider   *provider
	tracer     trace.Tracer
	session    string
	name       string
	out        io.Writer
	turn, step uint64 // the harness's numbering: every attempt is a step, every retry a new turn
}

// runTurn runs one user-visible turn: attempts until success or delegation.
func (l *agentLoop) runTurn(ctx context.Context, logicalTurnID string) error {
	ctx, span := l.client.StartTurn(ctx, l.tracer, logicalTurnID)
	defer span.End()
	l.turn++
	var after *retrydv1.RetryStarted
	for attempt := 1; ; attempt++ {
		l.step++
		attemptCtx, attemptSpan := l.tracer.Start(ctx, "attempt", retryd.AttemptOptions(after,
			trace.WithAttributes(attribute.Int("agentloop.attempt", attempt), attribute.Int64("agentloop.step", int64(l.step))))...)
		ans, err := l.provider.call(attemptCtx)
		if err != nil {
			attemptSpan.End()
			return err
		}
		if ans.status == 0 {
			attemptSpan.End()
			fmt.Fprintf(l.out, "turn %s: attempt %d succeeded\n", logicalTurnID, attempt)
			_, err := l.client.StepSucceeded(ctx, &retrydv1.StepSucceededRequest{
				SessionId: l.session, Turn: l.turn, Step: l.step, Provider: l.name})
			return err
		}
		failure := failureOf(ans)
		attemptSpan.SetStatus(codes.Error, failure.GetMessage())
		attemptSpan.SetAttributes(attribute.String("error.type", failure.GetCode()))
		out, err := l.client.Recover(attemptCtx, &retrydv1.FailedStepRequest{
			SessionId: l.session, Turn: l.turn, Step: l.step, LogicalTurnId: logicalTurnID,
			Provider: l.name, Failure: failure,
		})
		attemptSpan.End()
		switch {
		case err != nil:
			return err
		case out.Retry:
			fmt.Fprintf(l.out, "turn %s: %s\n", logicalTurnID, retryd.RenderRetry(out.Event.GetScheduled()))
			after = out.Started
			l.turn++ // the harness opens a new turn for the retry
		case out.Delegate != nil:
			fmt.Fprintf(l.out, "turn %s: delegated (%s): %s\n", logicalTurnID, out.Delegate.GetReason(), out.Delegate.GetDetail())
			return nil
		default:
			return errors.New("the retry was cancelled: " + out.Cancelled.GetReason().String())
		}
	}
}
