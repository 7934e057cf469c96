package invariant

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
)

// ReadJSONLines decodes one proto-JSON Event per non-empty line (protojson,
// the same encoding `retryd verify` reads and WatchEvents clients write).
// Lines may end in "\n" or "\r\n"; blank lines are skipped. Errors name the
// 1-based line number.
func ReadJSONLines(r io.Reader) ([]*retrydv1.Event, error) {
	br := bufio.NewReader(r)
	var events []*retrydv1.Event
	for line := 1; ; line++ {
		text, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read events: line %d: %w", line, err)
		}
		if trimmed := bytes.TrimSpace(text); len(trimmed) > 0 {
			ev := new(retrydv1.Event)
			if uerr := protojson.Unmarshal(trimmed, ev); uerr != nil {
				return nil, fmt.Errorf("read events: line %d: protojson.Unmarshal: %w", line, uerr)
			}
			events = append(events, ev)
		}
		if err != nil {
			return events, nil
		}
	}
}

// WriteJSONLines writes events as proto-JSON, one per line (protojson with
// default options, no multiline).
func WriteJSONLines(w io.Writer, events []*retrydv1.Event) error {
	// A bufio.Writer keeps its first write error and Flush returns it.
	bw := bufio.NewWriter(w)
	for i, ev := range events {
		b, err := protojson.Marshal(ev)
		if err != nil {
			return fmt.Errorf("write events: event %d: protojson.Marshal: %w", i, err)
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write events: %w", err)
	}
	return nil
}
