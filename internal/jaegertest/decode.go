package jaegertest

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The /api/v3 HTTP gateway answers with {"result": TracesData}, where
// TracesData is OTLP/JSON as written by the collector's ptrace.JSONMarshaler:
// hex trace and span IDs, decimal strings for 64-bit integers (timestamps,
// intValue) and numeric enums (span kind, status code). The decoder below
// also accepts the other forms the OTLP/JSON spec allows (base64 IDs, JSON
// numbers, enum names) so a change of marshaler does not break it.

type apiResponse struct {
	Result *tracesData `json:"result"`
}

type tracesData struct {
	ResourceSpans []resourceSpans `json:"resourceSpans"`
}

type resourceSpans struct {
	Resource struct {
		Attributes []keyValue `json:"attributes"`
	} `json:"resource"`
	ScopeSpans []struct {
		Spans []otlpSpan `json:"spans"`
	} `json:"scopeSpans"`
}

type otlpSpan struct {
	TraceID           otlpID     `json:"traceId"`
	SpanID            otlpID     `json:"spanId"`
	ParentSpanID      otlpID     `json:"parentSpanId"`
	Name              string     `json:"name"`
	StartTimeUnixNano otlpUint64 `json:"startTimeUnixNano"`
	EndTimeUnixNano   otlpUint64 `json:"endTimeUnixNano"`
	Attributes        []keyValue `json:"attributes"`
	Events            []struct {
		Name       string     `json:"name"`
		Attributes []keyValue `json:"attributes"`
	} `json:"events"`
	Links []struct {
		TraceID otlpID `json:"traceId"`
		SpanID  otlpID `json:"spanId"`
	} `json:"links"`
	Status struct {
		Code json.RawMessage `json:"code"`
	} `json:"status"`
}

type keyValue struct {
	Key   string    `json:"key"`
	Value *anyValue `json:"value"`
}

type anyValue struct {
	StringValue *string    `json:"stringValue"`
	BoolValue   *bool      `json:"boolValue"`
	IntValue    *otlpInt64 `json:"intValue"`
	DoubleValue *float64   `json:"doubleValue"`
	BytesValue  *string    `json:"bytesValue"`
	ArrayValue  *struct {
		Values []*anyValue `json:"values"`
	} `json:"arrayValue"`
	KvlistValue *struct {
		Values []keyValue `json:"values"`
	} `json:"kvlistValue"`
}

// otlpID is a trace or span ID, held as lower-case hex ("" when absent or
// all zero).
type otlpID string

func (id *otlpID) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("id: %w", err)
	}
	raw, err := decodeID(s)
	if err != nil {
		return err
	}
	if len(bytes.Trim(raw, "\x00")) == 0 {
		*id = ""
		return nil
	}
	*id = otlpID(hex.EncodeToString(raw))
	return nil
}

func decodeID(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) == 32 || len(s) == 16 {
		if raw, err := hex.DecodeString(s); err == nil {
			return raw, nil
		}
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("id %q is neither hex nor base64", s)
	}
	if len(raw) != 16 && len(raw) != 8 {
		return nil, fmt.Errorf("id %q decodes to %d bytes", s, len(raw))
	}
	return raw, nil
}

// otlpUint64 accepts a JSON number or a decimal string.
type otlpUint64 uint64

func (u *otlpUint64) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseUint(unquote(b), 10, 64)
	if err != nil {
		return fmt.Errorf("uint64 %s: %w", b, err)
	}
	*u = otlpUint64(v)
	return nil
}

// otlpInt64 accepts a JSON number or a decimal string.
type otlpInt64 int64

func (i *otlpInt64) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseInt(unquote(b), 10, 64)
	if err != nil {
		return fmt.Errorf("int64 %s: %w", b, err)
	}
	*i = otlpInt64(v)
	return nil
}

func unquote(b []byte) string {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

func decodeTraces(body []byte) ([]Trace, error) {
	var resp apiResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("jaegertest: decode response: %w", err)
	}
	if resp.Result == nil {
		return nil, fmt.Errorf("jaegertest: response has no result: %.200s", body)
	}
	var traces []Trace
	index := map[string]int{}
	for _, rs := range resp.Result.ResourceSpans {
		service := ""
		if v, ok := attributes(rs.Resource.Attributes)["service.name"].(string); ok {
			service = v
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				span, err := convertSpan(s, service)
				if err != nil {
					return nil, err
				}
				i, ok := index[span.TraceID]
				if !ok {
					i = len(traces)
					index[span.TraceID] = i
					traces = append(traces, Trace{TraceID: span.TraceID})
				}
				traces[i].Spans = append(traces[i].Spans, span)
			}
		}
	}
	for i := range traces {
		slices.SortStableFunc(traces[i].Spans, func(a, b Span) int {
			if c := a.Start.Compare(b.Start); c != 0 {
				return c
			}
			return strings.Compare(a.SpanID, b.SpanID)
		})
	}
	return traces, nil
}

func convertSpan(s otlpSpan, service string) (Span, error) {
	status, err := statusCode(s.Status.Code)
	if err != nil {
		return Span{}, fmt.Errorf("jaegertest: span %s: %w", s.SpanID, err)
	}
	span := Span{
		TraceID:      string(s.TraceID),
		SpanID:       string(s.SpanID),
		ParentSpanID: string(s.ParentSpanID),
		Name:         s.Name,
		ServiceName:  service,
		Start:        unixNano(s.StartTimeUnixNano),
		End:          unixNano(s.EndTimeUnixNano),
		Attributes:   attributes(s.Attributes),
		StatusCode:   status,
	}
	for _, l := range s.Links {
		span.Links = append(span.Links, Link{TraceID: string(l.TraceID), SpanID: string(l.SpanID)})
	}
	for _, e := range s.Events {
		span.Events = append(span.Events, SpanEvent{Name: e.Name, Attributes: attributes(e.Attributes)})
	}
	return span, nil
}

func unixNano(v otlpUint64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(v)).UTC()
}

// statusCode maps an OTLP status code (number or enum name) to the names
// used by go.opentelemetry.io/otel/codes: "Unset", "Ok", "Error".
func statusCode(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "Unset", nil
	}
	switch strings.TrimPrefix(unquote(raw), "STATUS_CODE_") {
	case "0", "UNSET":
		return "Unset", nil
	case "1", "OK":
		return "Ok", nil
	case "2", "ERROR":
		return "Error", nil
	}
	return "", fmt.Errorf("unknown status code %s", raw)
}

// attributes converts OTLP key/values to Go values: string, bool, int64,
// float64, []byte, []any and map[string]any.
func attributes(kvs []keyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.goValue()
	}
	return m
}

func (v *anyValue) goValue() any {
	switch {
	case v == nil:
		return nil
	case v.StringValue != nil:
		return *v.StringValue
	case v.BoolValue != nil:
		return *v.BoolValue
	case v.IntValue != nil:
		return int64(*v.IntValue)
	case v.DoubleValue != nil:
		return *v.DoubleValue
	case v.BytesValue != nil:
		b, err := base64.StdEncoding.DecodeString(*v.BytesValue)
		if err != nil {
			return *v.BytesValue
		}
		return b
	case v.ArrayValue != nil:
		out := make([]any, 0, len(v.ArrayValue.Values))
		for _, e := range v.ArrayValue.Values {
			out = append(out, e.goValue())
		}
		return out
	case v.KvlistValue != nil:
		return attributes(v.KvlistValue.Values)
	}
	return nil
}
