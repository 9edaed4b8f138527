package items

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// errMalformed stops the JSON scan: the text is not JSON the count can
// follow, and the decoder reports it.
var errMalformed = errors.New("malformed JSON")

// JSON checks the JSON text data of a message of type md (in protojson's
// mapping) against limit items per field (see the package comment),
// without decoding it: a scan of the text that follows md's fields by
// their JSON or proto names, counts the items of each array of a repeated
// field, the keys of each object of a map field, and the comma-separated
// paths of a FieldMask string. It returns a *TooMany, or nil; text the
// scan cannot follow (malformed, or a value of the wrong shape) is left
// to the decoder to report.
func JSON(data []byte, md protoreflect.MessageDescriptor, limit int) error {
	s := &jsonScan{data: data, c: counter{limit: limit}}
	s.ws()
	if s.peek() != '{' {
		return nil
	}
	if err := s.object(md, nil); err != nil && !errors.Is(err, errMalformed) {
		return err
	}
	return nil
}

// jsonScan is a position in a JSON text being counted.
type jsonScan struct {
	data []byte
	i    int
	c    counter
}

func (s *jsonScan) peek() byte {
	if s.i < len(s.data) {
		return s.data[s.i]
	}
	return 0
}

func (s *jsonScan) ws() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// expect consumes b after white space.
func (s *jsonScan) expect(b byte) error {
	s.ws()
	if s.peek() != b {
		return errMalformed
	}
	s.i++
	return nil
}

// str consumes a string and returns its text, escapes decoded.
func (s *jsonScan) str() (string, error) {
	raw, err := s.rawString()
	if err != nil || bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), err
	}
	return unescape(raw)
}

// rawString consumes a string and returns the bytes between its quotes,
// escapes as written.
func (s *jsonScan) rawString() ([]byte, error) {
	start := s.i
	if err := s.skipString(); err != nil {
		return nil, err
	}
	return s.data[start+1 : s.i-1], nil
}

// unescape decodes the escapes of a string's bytes between its quotes.
func unescape(raw []byte) (string, error) {
	var out string
	if err := json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &out); err != nil {
		return "", errMalformed
	}
	return out, nil
}

// skipString consumes a string, escapes and all.
func (s *jsonScan) skipString() error {
	if s.peek() != '"' {
		return errMalformed
	}
	for j := s.i + 1; j < len(s.data); j++ {
		switch s.data[j] {
		case '\\':
			j++
		case '"':
			s.i = j + 1
			return nil
		}
	}
	return errMalformed
}

// skip consumes one value of any shape, without recursion. What is not
// a value (a delimiter where a value should be) is left unconsumed for the
// caller to refuse.
func (s *jsonScan) skip() error {
	s.ws()
	switch s.peek() {
	case '"':
		return s.skipString()
	case '{', '[':
		depth := 0
		for s.i < len(s.data) {
			switch s.data[s.i] {
			case '"':
				if err := s.skipString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return nil
				}
			}
			s.i++
		}
		return errMalformed
	}
	for s.i < len(s.data) { // a number, true, false or null
		switch s.data[s.i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return nil
		}
		s.i++
	}
	return nil
}

// members scans an object, calling member for each key with the scan at
// its value; member consumes the value.
func (s *jsonScan) members(member func(key string) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	s.ws()
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		s.ws()
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		s.ws()
		if err := member(key); err != nil {
			return err
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return errMalformed
		}
	}
}

// object scans an object of message type md reached by path.
func (s *jsonScan) object(md protoreflect.MessageDescriptor, path []string) error {
	return s.members(func(key string) error {
		return s.field(fieldByJSONKey(md, key), path)
	})
}

// fieldByJSONKey is md's field a JSON key names: its JSON name or its
// proto name, as protojson accepts either; nil for neither.
func fieldByJSONKey(md protoreflect.MessageDescriptor, key string) protoreflect.FieldDescriptor {
	if fd := md.Fields().ByJSONName(key); fd != nil {
		return fd
	}
	return md.Fields().ByTextName(key)
}

// field scans the value of field fd (nil: unknown) of a message at path.
func (s *jsonScan) field(fd protoreflect.FieldDescriptor, path []string) error {
	switch {
	case fd == nil || len(path) >= maxDepth:
		return s.skip()
	case fd.IsMap():
		if s.peek() != '{' {
			return s.skip()
		}
		inner := within(path, fd.Name())
		return s.members(func(string) error {
			if err := s.c.add(fd, path, 1); err != nil {
				return err
			}
			if vd := fd.MapValue().Message(); vd != nil {
				return s.message(vd, inner)
			}
			return s.skip()
		})
	case fd.IsList():
		if s.peek() != '[' {
			return s.skip()
		}
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return nil
		}
		inner := within(path, fd.Name())
		for {
			if err := s.c.add(fd, path, 1); err != nil {
				return err
			}
			s.ws()
			var err error
			if fd.Message() != nil {
				err = s.message(fd.Message(), inner)
			} else {
				err = s.skip()
			}
			if err != nil {
				return err
			}
			s.ws()
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return errMalformed
			}
		}
	case fd.Message() != nil:
		return s.message(fd.Message(), within(path, fd.Name()))
	}
	return s.skip()
}

// message scans a value of message type md at path: an object of its
// fields, or a FieldMask's string of comma-separated paths.
func (s *jsonScan) message(md protoreflect.MessageDescriptor, path []string) error {
	switch {
	case md.FullName() == "google.protobuf.FieldMask" && s.peek() == '"':
		raw, err := s.rawString()
		if err != nil || len(raw) == 0 {
			return err
		}
		commas := bytes.Count(raw, []byte{','})
		if bytes.IndexByte(raw, '\\') >= 0 {
			v, err := unescape(raw)
			if err != nil {
				return err
			}
			commas = strings.Count(v, ",")
		}
		return s.c.add(md.Fields().ByName("paths"), path, commas+1)
	case s.peek() == '{':
		return s.object(md, path)
	}
	return s.skip()
}
