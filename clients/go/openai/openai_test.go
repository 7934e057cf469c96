package retrydopenai_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	retryd "github.com/retryd/retryd/clients/go"
	retrydopenai "github.com/retryd/retryd/clients/go/openai"
	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/proto"
)

// reply is one scripted answer of the fake provider.
type reply struct {
	status int
	header map[string]string
	body   string
	// events, when set, are sent as a text/event-stream, one write each.
	events []string
}

// provider is a scripted OpenAI-compatible server on loopback: each
// request gets the next reply of its script.
type provider struct {
	*httptest.Server
	mu       sync.Mutex
	script   []reply
	attempts int
}

func startProvider(t *testing.T) *provider {
	t.Helper()
	p := &provider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		p.mu.Lock()
		p.attempts++
		if len(p.script) == 0 {
			p.mu.Unlock()
			http.Error(w, "script exhausted", http.StatusTeapot)
			return
		}
		rep := p.script[0]
		p.script = p.script[1:]
		p.mu.Unlock()
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		if rep.events != nil {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for _, ev := range rep.events {
				_, _ = io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.status)
		_, _ = io.WriteString(w, rep.body)
	}))
	t.Cleanup(p.Close)
	return p
}

// play sets the script of the next call and returns a function that
// reports how many attempts the call made.
func (p *provider) play(script ...reply) func() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.script, p.attempts = script, 0
	return func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.script) != 0 {
			return -len(p.script)
		}
		return p.attempts
	}
}

func completion(content string) string {
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o",`+
		`"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}]}`, content)
}

func chunk(content string) string {
	return fmt.Sprintf("data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\","+
		"\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", content)
}

const (
	roleChunk   = "data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"
	stopChunk   = "data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
	doneEvent   = "data: [DONE]\n\n"
	serverError = `{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}`
	overloaded  = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
)

// testPolicy retries up to 5 times with exact delays 50, 100, 200… ms.
func testPolicy() *retrydv1.RetryPolicy {
	return &retrydv1.RetryPolicy{
		Mode:       retrydv1.Mode_MODE_NORMAL,
		MaxRetries: proto.Uint32(5),
		Backoff:    &retrydv1.Backoff{InitialDelayMs: proto.Uint64(50), JitterRatio: proto.Float64(0)},
	}
}

func newSDK(p *provider, r *retrydopenai.Retrier) openai.Client {
	opts := append([]option.RequestOption{option.WithBaseURL(p.URL + "/v1/"), option.WithAPIKey("sk-test")}, r.RequestOptions()...)
	return openai.NewClient(opts...)
}

var chatParams = openai.ChatCompletionNewParams{
	Model:    openai.ChatModelGPT4o,
	Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
}

// TestOpenAISDK drives the real openai-go SDK through the middleware
// against a scripted provider and a real retryd: the attempts each call
// made, the delays retryd decided (from its event log), the delegations,
// and `retryd verify` over the server's log.
func TestOpenAISDK(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	client, err := retryd.New(srv.Addr, retryd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	p := startProvider(t)
	const session = "openai-sdk"
	sdk := newSDK(p, retrydopenai.New(client, retrydopenai.WithPolicy(testPolicy())))
	ctx := retrydopenai.ContextWithSession(t.Context(), session)

	// 503, 429 with retry-after-ms, Anthropic's 529, an empty completion,
	// then the answer: four retries, then success.
	attempts := p.play(
		reply{status: 503, body: serverError},
		reply{status: 429, header: map[string]string{"retry-after-ms": "1500"},
			body: `{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","param":null,"code":"rate_limit_exceeded"}}`},
		reply{status: 529, header: map[string]string{"x-should-retry": "true"}, body: overloaded},
		reply{status: 200, body: completion("")},
		reply{status: 200, body: completion("hello")},
	)
	resp, err := sdk.Chat.Completions.New(ctx, chatParams)
	if err != nil {
		t.Fatalf("call 1: %v", err)
	}
	if got := resp.Choices[0].Message.Content; got != "hello" {
		t.Errorf("call 1 answered %q, want hello", got)
	}
	if n := attempts(); n != 5 {
		t.Errorf("call 1: %d provider attempts, want 5", n)
	}

	// 429 insufficient_quota: QUOTA is not retryable; the SDK's error
	// carries the delegate reason.
	attempts = p.play(reply{status: 429, body: `{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`})
	_, err = sdk.Chat.Completions.New(ctx, chatParams)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Fatalf("call 2: %v, want the provider's 429", err)
	}
	if reason, ok := retrydopenai.DelegateReason(err); !ok || reason != "DELEGATE_REASON_CODE_NOT_RETRYABLE" {
		t.Errorf("call 2: delegate reason %q (%v), want DELEGATE_REASON_CODE_NOT_RETRYABLE", reason, ok)
	}
	if n := attempts(); n != 1 {
		t.Errorf("call 2: %d provider attempts, want 1", n)
	}

	// A stream that ends with an error event after some tokens were
	// shown: replay-unsafe, delegated; the SDK sees the error.
	attempts = p.play(reply{events: []string{roleChunk, chunk("Hel"), chunk("lo"), "data: " + serverError + "\n\n"}})
	stream := sdk.Chat.Completions.NewStreaming(ctx, chatParams)
	var shown strings.Builder
	for stream.Next() {
		if len(stream.Current().Choices) > 0 {
			shown.WriteString(stream.Current().Choices[0].Delta.Content)
		}
	}
	if stream.Err() == nil || shown.String() != "Hello" {
		t.Errorf("call 3: shown %q, error %v; want Hello then the stream's error", shown.String(), stream.Err())
	}
	if n := attempts(); n != 1 {
		t.Errorf("call 3: %d provider attempts, want 1", n)
	}

	// An error event before any token: retried, and the SDK reads the
	// second stream as if it were the first.
	attempts = p.play(
		reply{events: []string{roleChunk, "event: error\ndata: " + overloaded + "\n\n"}},
		reply{events: []string{roleChunk, chunk("Hi"), chunk(" there"), stopChunk, doneEvent}},
	)
	stream = sdk.Chat.Completions.NewStreaming(ctx, chatParams)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if stream.Err() != nil || len(acc.Choices) == 0 || acc.Choices[0].Message.Content != "Hi there" {
		t.Errorf("call 4: %+v, %v; want Hi there", acc.Choices, stream.Err())
	}
	if n := attempts(); n != 2 {
		t.Errorf("call 4: %d provider attempts, want 2", n)
	}

	// What retryd decided, from its event log.
	var delays []string
	var delegations []string
	events, err := retrydtest.Events(t.Context(), srv.Conn(t), session)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		switch k := ev.GetKind().(type) {
		case *retrydv1.Event_Scheduled:
			delays = append(delays, fmt.Sprintf("%d %s %d", k.Scheduled.GetTurn(), k.Scheduled.GetFailure().GetCode(), k.Scheduled.GetDelayMs()))
		case *retrydv1.Event_Delegated:
			delegations = append(delegations, fmt.Sprintf("%d %s %s", k.Delegated.GetTurn(), k.Delegated.GetFailure().GetCode(), k.Delegated.GetReason()))
		}
	}
	wantDelays := []string{"1 SERVER 50", "1 RATE_LIMIT 1500", "1 SERVER 200", "1 EMPTY_RESPONSE 400", "4 SERVER 50"}
	if fmt.Sprint(delays) != fmt.Sprint(wantDelays) {
		t.Errorf("retryd's scheduled delays (turn, code, ms) = %q, want %q", delays, wantDelays)
	}
	wantDelegations := []string{"2 QUOTA DELEGATE_REASON_CODE_NOT_RETRYABLE", "3 SERVER DELEGATE_REASON_REPLAY_UNSAFE"}
	if fmt.Sprint(delegations) != fmt.Sprint(wantDelegations) {
		t.Errorf("retryd's delegations = %q, want %q", delegations, wantDelegations)
	}
	t.Logf("scheduled: %q; delegated: %q", delays, delegations)

	out, err := exec.Command(retrydtest.Binary(t), "verify", "--server", srv.Addr).CombinedOutput()
	if err != nil {
		t.Errorf("retryd verify --server: %v\n%s", err, out)
	}
}

// TestRoundTripper: any SDK with an *http.Client gets the same loop; here
// a plain http.Client posting to the provider.
func TestRoundTripper(t *testing.T) {
	t.Parallel()
	srv := retrydtest.Start(t)
	client, err := retryd.New(srv.Addr, retryd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	p := startProvider(t)
	r := retrydopenai.New(client, retrydopenai.WithPolicy(testPolicy()), retrydopenai.WithProvider("deepseek"))
	httpClient := &http.Client{Transport: r.RoundTripper(nil)}
	attempts := p.play(reply{status: 503, body: `{"error":{"message":"Server Overloaded","type":"service_unavailable_error","param":null,"code":"server_overloaded"}}`},
		reply{status: 200, body: completion("ok")})
	ctx, cancel := context.WithTimeout(retrydopenai.ContextWithSession(t.Context(), "roundtripper"), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/chat/completions", strings.NewReader(`{"model":"deepseek-chat"}`))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"ok"`) || attempts() != 2 {
		t.Errorf("status %d, body %s, %d attempts; want the second attempt's answer", resp.StatusCode, body, attempts())
	}
}

// TestAttemptLinksBackoffSpan: with a tracer, the attempt after a retry
// is a span linked to retryd's backoff span (the traceparent of the
// scheduled record).
func TestAttemptLinksBackoffSpan(t *testing.T) {
	t.Parallel()
	srv := retrydtest.StartWithEnv(t, []string{"OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=retryd"})
	client, err := retryd.New(srv.Addr, retryd.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	spans := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)).Tracer("agent")
	p := startProvider(t)
	sdk := newSDK(p, retrydopenai.New(client, retrydopenai.WithPolicy(testPolicy()), retrydopenai.WithTracer(tracer)))
	attempts := p.play(reply{status: 503, body: serverError}, reply{status: 200, body: completion("hi")})
	if _, err := sdk.Chat.Completions.New(retrydopenai.ContextWithSession(t.Context(), "traced"), chatParams); err != nil {
		t.Fatal(err)
	}
	if n := attempts(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	events, err := retrydtest.Events(t.Context(), srv.Conn(t), "traced")
	if err != nil {
		t.Fatal(err)
	}
	var backoff string
	for _, ev := range events {
		if s := ev.GetScheduled(); s != nil {
			backoff = s.GetTraceparent()
		}
	}
	if backoff == "" {
		t.Fatal("retryd recorded no backoff traceparent: is tracing on?")
	}
	var attemptSpans []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "provider attempt" {
			attemptSpans = append(attemptSpans, s)
		}
	}
	if len(attemptSpans) != 2 {
		t.Fatalf("%d provider attempt spans, want 2", len(attemptSpans))
	}
	if links := attemptSpans[0].Links(); len(links) != 0 {
		t.Errorf("the first attempt has links %v, want none", links)
	}
	links := attemptSpans[1].Links()
	if len(links) != 1 || !strings.Contains(backoff, links[0].SpanContext.SpanID().String()) ||
		!strings.Contains(backoff, links[0].SpanContext.TraceID().String()) {
		t.Errorf("the retry attempt's links %v; want one to the backoff span %s", links, backoff)
	}
}
