// Produces the job's records in one WriteMessages call with kafka-go's Writer (its defaults
// but for acks all and partition 0).
package main

import (
	"context"
	"errors"
	"log"
	"os"

	"github.com/segmentio/kafka-go"

	"kvproxy.test/goclients/job"
)

type partitionZero struct{}

func (partitionZero) Balance(kafka.Message, ...int) int { return 0 }

func main() {
	work := job.Read()
	logger := log.New(os.Stderr, "", 0)
	writer := &kafka.Writer{
		Addr:         kafka.TCP(work.Bootstrap),
		Topic:        work.Topic,
		Balancer:     partitionZero{},
		RequiredAcks: kafka.RequireAll,
		ErrorLogger:  logger,
		Logger:       logger,
	}
	messages := make([]kafka.Message, len(work.Records))
	for n, r := range work.Records {
		messages[n].Value = []byte(r.Value)
		if r.Key != nil {
			messages[n].Key = []byte(*r.Key)
		}
	}
	result := job.NewResult(len(work.Records))
	err := writer.WriteMessages(context.Background(), messages...)
	logger.Printf("WriteMessages returned %T", err)
	var each kafka.WriteErrors
	switch {
	case errors.As(err, &each):
		for n, failed := range each {
			if failed != nil {
				result.Fail(n, failed)
			}
		}
	case err != nil:
		for n := range work.Records {
			result.Fail(n, err)
		}
	}
	if err := writer.Close(); err != nil {
		panic(err)
	}
	result.Print()
}
