package ops

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/effectline/effectline/internal/kafka"
)

// DeadLetter is one message of the dead-letter topic, as the project's own
// reader (kafka.ReadDeadLetters) returns it: the refused message's key and
// value unchanged, why it was refused and where it was read from.
type DeadLetter struct{ kafka.DeadLetter }

// source is where the refused message was read, topic/partition/offset.
func (d DeadLetter) source() string {
	if d.Topic == "" {
		return ""
	}
	return d.Topic + "/" + strconv.Itoa(int(d.Partition)) + "/" + strconv.FormatInt(d.Offset, 10)
}

// headers are the dead-letter headers the copy carries (contract §14),
// those it has.
func (d DeadLetter) headers() map[string]string {
	h := map[string]string{}
	set := func(name, value string) {
		if value != "" {
			h[name] = value
		}
	}
	set(kafka.HeaderDeadLetterError, d.Reason)
	set(kafka.HeaderDeadLetterDetail, d.Detail)
	if d.Topic != "" {
		h[kafka.HeaderDeadLetterTopic] = d.Topic
		h[kafka.HeaderDeadLetterPartition] = strconv.Itoa(int(d.Partition))
		h[kafka.HeaderDeadLetterOffset] = strconv.FormatInt(d.Offset, 10)
	}
	return h
}

// MarshalJSON writes the key and value as text when they are UTF-8 (an
// intent is JSON, and a refused one usually nearly so), else as base64
// under key_base64 / value_base64, so any message survives the round trip.
// partition and offset are the copy's place on the dead-letter topic; the
// source_ members are where the refused message was.
func (d DeadLetter) MarshalJSON() ([]byte, error) {
	h := d.headers()
	out := map[string]any{
		"partition":        d.DLQPartition,
		"offset":           d.DLQOffset,
		"timestamp":        d.At.UTC(),
		"reason":           d.Reason,
		"detail":           d.Detail,
		"source_topic":     h[kafka.HeaderDeadLetterTopic],
		"source_partition": h[kafka.HeaderDeadLetterPartition],
		"source_offset":    h[kafka.HeaderDeadLetterOffset],
		"headers":          h,
	}
	for name, b := range map[string][]byte{"key": d.Key, "value": d.Value} {
		if utf8.Valid(b) {
			out[name] = string(b)
		} else {
			out[name+"_base64"] = base64.StdEncoding.EncodeToString(b)
		}
	}
	return json.Marshal(out)
}

// ErrNoTopic is returned (wrapped) when the dead-letter topic does not
// exist on the brokers.
var ErrNoTopic = errors.New("topic does not exist")

// dlqTimeout bounds each request to the brokers.
const dlqTimeout = 10 * time.Second

// readDeadLetters reads the dead-letter topic of prefix as it stands, with
// kafka.ReadDeadLetters: outside any consumer group, committing nothing,
// so reading the dead letters never moves anyone's offsets. The result is
// in time order; with limit > 0 it is the newest limit of them, which is
// why every partition is read whole and cut here, not by the reader
// (which keeps the first ones).
func readDeadLetters(ctx context.Context, brokers []string, prefix string, limit int) ([]DeadLetter, error) {
	c := kafka.Config{Brokers: brokers, TopicPrefix: prefix, ClientID: "effectline-ops", ConnectTimeout: dlqTimeout}
	got, err := kafka.ReadDeadLetters(ctx, c, 0)
	if errors.Is(err, kafkago.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("%s: %w on %s: nothing was ever dead-lettered there, or %s names another prefix",
			c.Topic(dlqSuffix), ErrNoTopic, strings.Join(brokers, ","), EnvTopicPrefix)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the dead letters from Kafka at %s (%s): %w", strings.Join(brokers, ","), EnvKafkaBrokers, err)
	}
	out := make([]DeadLetter, len(got))
	for i, d := range got {
		out[i] = DeadLetter{d}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}
