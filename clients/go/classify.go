package retryd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"google.golang.org/protobuf/proto"
)

// The failure codes Classify produces besides the policies' default ones.
const (
	// CodeProviderNoRetry replaces the code of a failure whose response
	// carried "x-should-retry: false": no default code list names it, so
	// normal and schedule modes delegate it.
	CodeProviderNoRetry = "PROVIDER_NO_RETRY"
	// CodeInvalidRequest is a request the provider rejected as malformed
	// (HTTP 400, 404, 413, 422); no default code list names it.
	CodeInvalidRequest = "INVALID_REQUEST"
	// CodeContextWindowExceeded is a prompt over the model's context
	// window; compaction, not a retry, recovers it.
	CodeContextWindowExceeded = "CONTEXT_WINDOW_EXCEEDED"
)

// ErrorKind names what went wrong when a model request raised an error
// instead of, or while reading, a response.
type ErrorKind string

// The error kinds of the shared classification vectors.
const (
	// ErrorKindNone: the request got a response (or ended without an
	// error).
	ErrorKindNone ErrorKind = ""
	// ErrorKindConnectionRefused: nothing accepted the connection.
	ErrorKindConnectionRefused ErrorKind = "connection_refused"
	// ErrorKindConnectionReset: the peer reset or closed the connection.
	ErrorKindConnectionReset ErrorKind = "connection_reset"
	// ErrorKindDNS: the provider's name did not resolve.
	ErrorKindDNS ErrorKind = "dns"
	// ErrorKindTLS: the TLS handshake or certificate check failed.
	ErrorKindTLS ErrorKind = "tls"
	// ErrorKindTimeout: the client's own deadline passed.
	ErrorKindTimeout ErrorKind = "timeout"
	// ErrorKindStreamTruncated: a response body or stream ended before its
	// terminal event.
	ErrorKindStreamTruncated ErrorKind = "stream_truncated"
	// ErrorKindAborted: the caller cancelled the request.
	ErrorKindAborted ErrorKind = "aborted"
)

// ErrorKindOf returns the kind of a Go error from an HTTP client: the
// syscall errors ECONNREFUSED and ECONNRESET (and EPIPE, ECONNABORTED),
// *net.DNSError, TLS and certificate errors, context.Canceled (aborted),
// context.DeadlineExceeded or a net.Error that timed out, and
// io.ErrUnexpectedEOF or io.EOF (stream truncated). Any other non-nil
// error counts as ErrorKindConnectionReset, a transport failure; nil is
// ErrorKindNone.
func ErrorKindOf(err error) ErrorKind {
	if err == nil {
		return ErrorKindNone
	}
	var dnsErr *net.DNSError
	var recordErr tls.RecordHeaderError
	var alertErr tls.AlertError
	var verifyErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var certErr x509.CertificateInvalidError
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return ErrorKindAborted
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorKindTimeout
	case errors.As(err, &dnsErr):
		if dnsErr.IsTimeout {
			return ErrorKindTimeout
		}
		return ErrorKindDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return ErrorKindConnectionRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return ErrorKindConnectionReset
	case errors.As(err, &recordErr), errors.As(err, &alertErr), errors.As(err, &verifyErr),
		errors.As(err, &unknownAuth), errors.As(err, &hostErr), errors.As(err, &certErr):
		return ErrorKindTLS
	case errors.As(err, &netErr) && netErr.Timeout():
		return ErrorKindTimeout
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return ErrorKindStreamTruncated
	}
	return ErrorKindConnectionReset
}

// ProviderFailure is what an agent saw when one model request failed.
// Set the fields that apply; the zero value of each means "not seen".
type ProviderFailure struct {
	// Status is the response's HTTP status; 0 when no response arrived.
	// An error inside a stream keeps the stream's status (200).
	Status int
	// Header is the response's header (retry-after-ms, retry-after,
	// x-should-retry are read).
	Header http.Header
	// Body is the error body as it arrived, or the data of a stream's
	// error event (OpenAI-compatible {"error":{…}} or Anthropic's
	// {"type":"error","error":{…}}); it need not be JSON.
	Body []byte
	// Kind is the client error the request raised instead of, or while
	// reading, a response. When empty and Err is set, ErrorKindOf(Err)
	// decides.
	Kind ErrorKind
	// Err is the error the HTTP client or SDK returned, if any.
	Err error
	// OutputShown reports that streamed output of this attempt was
	// already shown to the user: a replay would show a second answer.
	OutputShown bool
	// EmptyCompletion reports that the response completed with nothing in
	// it: a stop with no content and no tool calls.
	EmptyCompletion bool
}

// Classification is the report Classify derived from a provider failure.
type Classification struct {
	// Failure is the FailedStepRequest.failure to send.
	Failure *retrydv1.Failure
	// Replay is the FailedStepRequest.replay to send.
	Replay retrydv1.Replay
}

// Apply sets req's failure and replay from the classification.
func (c Classification) Apply(req *retrydv1.FailedStepRequest) *retrydv1.FailedStepRequest {
	req.Failure, req.Replay = c.Failure, c.Replay
	return req
}

// maxFailureMessage is the server's bound on Failure.message.
const maxFailureMessage = 4096

// maxRetryAfter is the server's bound on Failure.retry_after; a longer
// value is no valid Retry-After anyway.
const maxRetryAfter = 256

// retryAfterMsOver is one more than the largest delay a policy may name:
// the server reads it as over any cap.
const retryAfterMsOver = math.MaxInt32 + 1

// defaultRetried is normal mode's default code list: what x-should-retry:
// true promotes a code into.
var defaultRetried = map[string]bool{
	"EMPTY_RESPONSE": true, "RATE_LIMIT": true, "SERVER": true, "TIMEOUT": true, "TRANSPORT": true,
}

// errorTypeCodes maps a provider error's code or type, as an error inside
// an accepted (2xx) response carries it, to a failure code.
var errorTypeCodes = map[string]string{
	"insufficient_quota":      "QUOTA",
	"billing_error":           "QUOTA",
	"rate_limit_error":        "RATE_LIMIT",
	"rate_limit_exceeded":     "RATE_LIMIT",
	"overloaded_error":        "SERVER",
	"api_error":               "SERVER",
	"server_error":            "SERVER",
	"timeout_error":           "TIMEOUT",
	"authentication_error":    "AUTH",
	"permission_error":        "AUTH",
	"invalid_api_key":         "AUTH",
	"context_length_exceeded": CodeContextWindowExceeded,
	"invalid_request_error":   CodeInvalidRequest,
	"not_found_error":         CodeInvalidRequest,
	"request_too_large":       CodeInvalidRequest,
}

// retryAfterMsSyntax is the accepted form of a retry-after-ms value.
var retryAfterMsSyntax = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// providerError is the error object of an OpenAI-compatible or Anthropic
// error body.
type providerError struct {
	errType, errCode, message string
}

func parseProviderError(body []byte) (providerError, bool) {
	var doc struct {
		Error json.RawMessage `json:"error"`
	}
	if len(body) == 0 || json.Unmarshal(body, &doc) != nil || len(doc.Error) == 0 || doc.Error[0] != '{' {
		return providerError{}, false
	}
	var obj map[string]any
	if json.Unmarshal(doc.Error, &obj) != nil {
		return providerError{}, false
	}
	str := func(k string) string {
		s, _ := obj[k].(string)
		return s
	}
	return providerError{errType: str("type"), errCode: str("code"), message: str("message")}, true
}

// Classify turns a provider failure into retryd's Failure and Replay, by
// the rules in docs/clients.md ("Classifying provider errors") that every
// retryd client shares (testdata/classify).
func Classify(f ProviderFailure) Classification {
	c := Classification{Replay: retrydv1.Replay_REPLAY_SAFE}
	if f.OutputShown {
		c.Replay = retrydv1.Replay_REPLAY_UNSAFE
	}
	status := max(f.Status, 0)
	failure := &retrydv1.Failure{HttpStatus: uint32(min(status, 999))}
	c.Failure = failure

	kind := f.Kind
	if kind == ErrorKindNone && f.Err != nil {
		kind = ErrorKindOf(f.Err)
	}
	if kind != ErrorKindNone {
		switch kind {
		case ErrorKindAborted:
			failure.Code = "ABORTED"
		case ErrorKindTimeout:
			failure.Code = "TIMEOUT"
		default:
			failure.Code = "TRANSPORT"
		}
		failure.Message = failureMessage(string(kind), f.Err, "")
		return c
	}

	perr, hasErr := parseProviderError(f.Body)
	switch {
	case status != 0 && (status < 200 || status > 299):
		failure.Code = statusCode(status, perr)
	case hasErr:
		failure.Code = errorTypeCode(perr)
	case f.EmptyCompletion:
		failure.Code = "EMPTY_RESPONSE"
	default:
		failure.Code = "MALFORMED_RESPONSE"
	}
	if failure.Code == CodeInvalidRequest && contextOverflow(perr) {
		failure.Code = CodeContextWindowExceeded
	}
	original := failure.Code
	switch f.Header.Get("x-should-retry") {
	case "false":
		failure.Code = CodeProviderNoRetry
	case "true":
		if !defaultRetried[failure.Code] {
			failure.Code = "SERVER"
			if status == http.StatusTooManyRequests {
				failure.Code = "RATE_LIMIT"
			}
		}
	}
	if v := f.Header.Get("retry-after-ms"); retryAfterMsSyntax.MatchString(v) {
		if ms, err := strconv.ParseFloat(v, 64); err == nil {
			failure.ProviderRetryAfterMs = proto.Int64(int64(math.Min(math.Ceil(ms), retryAfterMsOver)))
		}
	}
	if v := f.Header.Get("retry-after"); v != "" && len(v) <= maxRetryAfter {
		failure.RetryAfter = proto.String(v)
	}
	detail := perr.message
	if !hasErr && status >= 300 {
		detail = http.StatusText(status)
	}
	label := original
	if original != failure.Code {
		label = fmt.Sprintf("%s (x-should-retry: %s)", original, f.Header.Get("x-should-retry"))
	}
	if status != 0 {
		label = fmt.Sprintf("HTTP %d %s", status, label)
	}
	failure.Message = failureMessage(label, nil, detail)
	return c
}

// statusCode is the failure code of an HTTP status that is not 2xx.
func statusCode(status int, perr providerError) string {
	switch {
	case status == 400, status == 404, status == 413, status == 422:
		return CodeInvalidRequest
	case status == 401, status == 403:
		return "AUTH"
	case status == 402:
		return "QUOTA"
	case status == 408:
		return "TIMEOUT"
	case status == 429:
		if perr.errCode == "insufficient_quota" || perr.errType == "insufficient_quota" {
			return "QUOTA"
		}
		return "RATE_LIMIT"
	case status >= 500 && status <= 599:
		return "SERVER"
	}
	return "HTTP_" + strconv.Itoa(status)
}

// errorTypeCode is the failure code of a provider error inside an
// accepted response: by its code, else its type, else SERVER.
func errorTypeCode(perr providerError) string {
	if c, ok := errorTypeCodes[perr.errCode]; ok {
		return c
	}
	if c, ok := errorTypeCodes[perr.errType]; ok {
		return c
	}
	return "SERVER"
}

func contextOverflow(perr providerError) bool {
	if perr.errCode == "context_length_exceeded" {
		return true
	}
	msg := strings.ToLower(perr.message)
	return strings.Contains(msg, "maximum context length") || strings.Contains(msg, "prompt is too long")
}

// failureMessage renders Failure.message within the server's 4 KiB bound.
func failureMessage(label string, err error, detail string) string {
	msg := label
	switch {
	case err != nil:
		msg += ": " + err.Error()
	case detail != "":
		msg += ": " + detail
	}
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	if len(msg) <= maxFailureMessage {
		return msg
	}
	cut := maxFailureMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}
