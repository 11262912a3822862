// Produces the job's records in one WriteMessages call with kafka-go 0.2's Writer (its defaults
// but for acks all and partition 0). A module of its own: the other programs use kafka-go 0.4.
package main

import (
	"context"

	"github.com/segmentio/kafka-go"

	"kvproxy.test/goclients/job"
)

func partitionZero(kafka.Message, ...int) int { return 0 }

func main() {
	work := job.Read()
	writer := kafka.NewWriter(kafka.WriterConfig{
		Brokers:      []string{work.Bootstrap},
		Topic:        work.Topic,
		Balancer:     kafka.BalancerFunc(partitionZero),
		RequiredAcks: -1,
	})
	messages := make([]kafka.Message, len(work.Records))
	for n, r := range work.Records {
		messages[n].Value = []byte(r.Value)
		if r.Key != nil {
			messages[n].Key = []byte(*r.Key)
		}
	}
	result := job.NewResult(len(work.Records))
	if err := writer.WriteMessages(context.Background(), messages...); err != nil {
		for n := range work.Records {
			result.Fail(n, err)
		}
	}
	if err := writer.Close(); err != nil {
		panic(err)
	}
	result.Print()
}
