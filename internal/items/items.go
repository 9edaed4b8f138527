// Package items counts the list items of a request before it is decoded,
// so that neither edge builds a message with more items than a call may
// carry. One rule serves both: the gRPC codec counts the wire bytes (Wire),
// the HTTP edge the JSON text (JSON).
//
// The rule: every repeated or map field of the request type is counted at
// every depth, its items added up over the whole message — the tokens of
// all of StreamDeliveriesRequest.nacks count together as nacks.tokens — and
// no field may hold more than the limit. A packed list counts its
// elements, not its one wire record, and a FieldMask counts its paths,
// whether they come as a list (protobuf) or as one comma-separated string
// (JSON). Since a request type has a fixed number of fields, a message
// holds at most limit items per field of its schema, whatever its nesting.
// A leaf: it imports no delayd package.
package items

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxDepth bounds how deep the count follows nested messages. delayd's
// requests nest a few levels; deeper bytes are left to the decoder, whose
// own recursion limit refuses them.
const maxDepth = 32

// TooMany is the refusal of a message that has more than Limit items of
// one field.
type TooMany struct {
	// Field is the field's path from the request, its proto names joined
	// by dots ("tokens", "nacks.tokens", "update_mask.paths").
	Field string
	// Limit is the most items the field may hold in one message.
	Limit int
}

func (e *TooMany) Error() string {
	if strings.Contains(e.Field, ".") {
		return fmt.Sprintf("%s has more than %d items in all; at most %d are allowed in one call", e.Field, e.Limit, e.Limit)
	}
	return fmt.Sprintf("%s has more than %d items; at most %d are allowed in one call", e.Field, e.Limit, e.Limit)
}

// counter adds up the items of each field of one message.
type counter struct {
	limit  int
	counts map[protoreflect.FieldDescriptor]int
}

// add counts n items of fd, reached by path, and refuses the message when
// fd then holds more than the limit.
func (c *counter) add(fd protoreflect.FieldDescriptor, path []string, n int) error {
	if c.counts == nil {
		c.counts = make(map[protoreflect.FieldDescriptor]int)
	}
	c.counts[fd] += n
	if c.counts[fd] > c.limit {
		return &TooMany{Field: fieldPath(path, fd), Limit: c.limit}
	}
	return nil
}

// fieldPath names fd reached through the message fields of path.
func fieldPath(path []string, fd protoreflect.FieldDescriptor) string {
	if len(path) == 0 {
		return string(fd.Name())
	}
	return strings.Join(path, ".") + "." + string(fd.Name())
}

// within returns path with field name appended, in a slice of its own.
func within(path []string, name protoreflect.Name) []string {
	return append(path[:len(path):len(path)], string(name))
}

// Wire checks the protobuf wire bytes b of a message of type md against
// limit items per field (see the package comment). It returns a *TooMany,
// or nil; malformed bytes are left to the decoder to report.
func Wire(b []byte, md protoreflect.MessageDescriptor, limit int) error {
	c := &counter{limit: limit}
	return c.wire(b, md, nil)
}

func (c *counter) wire(b []byte, md protoreflect.MessageDescriptor, path []string) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil
		}
		v := b[:m]
		b = b[m:]
		fd := md.Fields().ByNumber(num)
		if fd == nil {
			continue
		}
		if fd.IsList() || fd.IsMap() {
			if err := c.add(fd, path, wireItems(fd, typ, v)); err != nil {
				return err
			}
		}
		if fd.Message() != nil && typ == protowire.BytesType && len(path) < maxDepth {
			inner, k := protowire.ConsumeBytes(v)
			if k < 0 {
				return nil
			}
			if err := c.wire(inner, fd.Message(), within(path, fd.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// wireItems is the number of items in one wire record v (its tag already
// consumed) of list or map field fd: one, or a packed list's elements.
func wireItems(fd protoreflect.FieldDescriptor, typ protowire.Type, v []byte) int {
	if typ != protowire.BytesType || fd.IsMap() {
		return 1
	}
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind, protoreflect.GroupKind:
		return 1
	}
	packed, n := protowire.ConsumeBytes(v)
	if n < 0 {
		return 1
	}
	switch fd.Kind() {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return len(packed) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return len(packed) / 8
	}
	items := 0 // varints: one per byte without the continuation bit
	for _, x := range packed {
		if x < 0x80 {
			items++
		}
	}
	return items
}
