package retrydopenai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	retryd "github.com/retryd/retryd/clients/go"
)

// streamBody reads a server-sent-event stream for the SDK and watches it:
//
//   - until the first event with content (text, a refusal, a tool call)
//     it holds the events back, so an error event or a broken stream
//     before that is reported to retryd as a replay-safe failure and,
//     when retryd retries, the request is sent again and the SDK reads
//     the new stream instead, none the wiser;
//   - after content was passed on (shown to the user), an error event or
//     a broken stream is reported as replay-unsafe (retryd delegates) and
//     the SDK gets the error as the provider sent it;
//   - a stream that ends cleanly reports StepSucceeded.
type streamBody struct {
	c    *call
	step uint64
	resp *http.Response
	rc   io.ReadCloser
	rd   *bufio.Reader

	// held are the events not yet passed on; ready the bytes the SDK may
	// read now.
	held, ready bytes.Buffer
	shown       bool
	// event is the current event's name and data lines.
	event string
	data  bytes.Buffer
	// replaced is the response that took over after a retry.
	replaced io.ReadCloser
	done     bool
	err      error
}

func newStreamBody(c *call, step uint64, resp *http.Response) *streamBody {
	return &streamBody{c: c, step: step, resp: resp, rc: resp.Body, rd: bufio.NewReader(resp.Body)}
}

func (s *streamBody) Read(p []byte) (int, error) {
	for {
		if s.replaced != nil {
			return s.replaced.Read(p)
		}
		if s.ready.Len() > 0 {
			return s.ready.Read(p)
		}
		if s.err != nil {
			return 0, s.err
		}
		if err := s.advance(); err != nil {
			s.err = err
		}
	}
}

func (s *streamBody) Close() error {
	if s.replaced != nil {
		_ = s.rc.Close()
		return s.replaced.Close()
	}
	return s.rc.Close()
}

// advance reads one line of the stream and acts on it.
func (s *streamBody) advance() error {
	line, err := s.rd.ReadBytes('\n')
	if len(line) > 0 {
		s.out().Write(line)
		s.parse(bytes.TrimRight(line, "\r\n"))
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		if len(line) > 0 { // a last event without its blank line
			s.dispatch()
		}
		if s.replaced != nil || s.ready.Len() > 0 && s.err != nil {
			return nil
		}
		s.flush()
		if !s.done {
			s.done = true
			s.c.succeeded(s.step)
		}
		return io.EOF
	}
	// The stream broke.
	return s.fail(retryd.ProviderFailure{Status: s.resp.StatusCode, Header: s.resp.Header, Err: err, OutputShown: s.shown}, err)
}

func (s *streamBody) out() *bytes.Buffer {
	if s.shown {
		return &s.ready
	}
	return &s.held
}

func (s *streamBody) flush() {
	_, _ = s.held.WriteTo(&s.ready)
}

func (s *streamBody) parse(line []byte) {
	switch {
	case len(line) == 0:
		s.dispatch()
	case bytes.HasPrefix(line, []byte("event:")):
		s.event = string(bytes.TrimSpace(line[len("event:"):]))
	case bytes.HasPrefix(line, []byte("data:")):
		if s.data.Len() > 0 {
			s.data.WriteByte('\n')
		}
		s.data.Write(bytes.TrimPrefix(line[len("data:"):], []byte(" ")))
	}
}

// dispatch acts on a complete event.
func (s *streamBody) dispatch() {
	event, data := s.event, bytes.Clone(s.data.Bytes())
	s.event = ""
	s.data.Reset()
	if len(data) == 0 {
		return
	}
	if isErrorEvent(event, data) {
		f := retryd.ProviderFailure{Status: s.resp.StatusCode, Header: s.resp.Header, Body: data, OutputShown: s.shown}
		if err := s.fail(f, nil); err != nil {
			s.err = err
		}
		return
	}
	if !s.shown && hasContent(data) {
		s.shown = true
		s.flush()
	}
}

// fail reports a failure of the stream. Before anything was shown a retry
// replaces the stream; otherwise the SDK gets what the provider sent (the
// error event, already in the buffers) or cause.
func (s *streamBody) fail(f retryd.ProviderFailure, cause error) error {
	s.done = true
	out, rerr := s.c.report(s.step, f)
	switch {
	case rerr != nil:
		s.flush()
		return errors.Join(cause, rerr)
	case out.Retry:
		resp, err := s.c.attempts(s.step+1, out.Started)
		if err != nil {
			return err
		}
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			return fmt.Errorf("retrydopenai: the retried stream answered HTTP %d (%s: %s): %s",
				resp.StatusCode, HeaderDelegateReason, resp.Header.Get(HeaderDelegateReason), b)
		}
		s.held.Reset()
		s.ready.Reset()
		s.replaced = resp.Body
		return nil
	}
	s.flush()
	if cause != nil {
		return &DelegatedError{Err: cause, Outcome: out}
	}
	return nil
}

// isErrorEvent reports whether an event is a provider error: Anthropic's
// "event: error", or data with an "error" object (OpenAI-compatible).
func isErrorEvent(event string, data []byte) bool {
	if event == "error" {
		return true
	}
	var doc struct {
		Error json.RawMessage `json:"error"`
	}
	return json.Unmarshal(data, &doc) == nil && len(doc.Error) > 0 && doc.Error[0] == '{'
}

// hasContent reports whether an event carries output a user would see:
// OpenAI-compatible text, refusal or tool-call deltas, or Anthropic
// content block deltas.
func hasContent(data []byte) bool {
	var doc struct {
		Type    string `json:"type"`
		Choices []struct {
			Delta struct {
				Content   string            `json:"content"`
				Refusal   string            `json:"refusal"`
				ToolCalls []json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &doc) != nil {
		return false
	}
	if doc.Type == "content_block_delta" {
		return true
	}
	for _, ch := range doc.Choices {
		if ch.Delta.Content != "" || ch.Delta.Refusal != "" || len(ch.Delta.ToolCalls) > 0 {
			return true
		}
	}
	return false
}
