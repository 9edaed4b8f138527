package web

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"unicode/utf8"
)

// A protojson error names the position of the value it refused ("proto:
// (line 1:58): invalid google.protobuf.Duration value \"30\"") but, for a
// duration or a time, not its field, and for bytes not the encoding it
// wants. explainJSON turns the errors a person makes most into ones that
// name the field and the format, as the gRPC edge's validation does.
var (
	reJSONPos      = regexp.MustCompile(`\(line (\d+):(\d+)\)`)
	reJSONBytes    = regexp.MustCompile(`invalid value for bytes field (\w+): (.*)$`)
	reJSONDuration = regexp.MustCompile(`invalid google\.protobuf\.Duration value (.*)$`)
	reJSONTime     = regexp.MustCompile(`invalid google\.protobuf\.Timestamp value (.*)$`)
)

// explainJSON is the message for err, protojson's refusal of data: the
// field, its value and the format wanted for a bytes field (base64), a
// duration or a time; err's own text otherwise.
func explainJSON(data []byte, err error) string {
	msg := err.Error()
	field, where := "", ""
	if m := reJSONPos.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		col, _ := strconv.Atoi(m[2])
		field, where = fieldAt(data, line, col), " ("+m[0][1:len(m[0])-1]+")"
	}
	switch {
	case reJSONBytes.MatchString(msg):
		m := reJSONBytes.FindStringSubmatch(msg)
		return fmt.Sprintf("%s%s is %s, which is not base64: JSON carries a bytes field as base64 "+
			`(standard or URL-safe alphabet, padding optional), e.g. "eyJvcmRlciI6NDJ9" for {"order":42}; base64 -w0 makes it`,
			m[1], where, m[2])
	case reJSONDuration.MatchString(msg) && field != "":
		return fmt.Sprintf("%s%s is %s, which is not a duration: JSON writes a duration as a string of seconds "+
			`with the unit s, e.g. "30s", "0.5s" or "900s" for 15 minutes (no other unit: not "30", "15m" or "1h")`,
			field, where, reJSONDuration.FindStringSubmatch(msg)[1])
	case reJSONTime.MatchString(msg) && field != "":
		return fmt.Sprintf("%s%s is %s, which is not a time: JSON writes a time as an RFC 3339 string, "+
			`e.g. "2026-12-01T15:04:05Z" or "2026-12-01T16:04:05+01:00"`,
			field, where, reJSONTime.FindStringSubmatch(msg)[1])
	}
	return msg
}

// fieldAt is the name of the JSON object key whose value starts at line
// and column (protojson's: 1-based, the column in runes), or "" when the
// value there is no object member's.
func fieldAt(data []byte, line, col int) string {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return ""
		}
		off += i + 1
	}
	for c := 1; c < col && off < len(data); c++ {
		_, size := utf8.DecodeRune(data[off:])
		off += size
	}
	before := bytes.TrimRight(data[:min(off, len(data))], " \t\r\n")
	if !bytes.HasSuffix(before, []byte(":")) {
		return ""
	}
	before = bytes.TrimRight(before[:len(before)-1], " \t\r\n")
	if !bytes.HasSuffix(before, []byte(`"`)) {
		return ""
	}
	before = before[:len(before)-1]
	i := bytes.LastIndexByte(before, '"')
	if i < 0 {
		return ""
	}
	return string(before[i+1:])
}
