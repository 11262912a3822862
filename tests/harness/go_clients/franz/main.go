// Produces the job's records in one batch with franz-go (the defaults: idempotent, acks all).
package main

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"kvproxy.test/goclients/job"
)

func main() {
	work := job.Read()
	client, err := kgo.NewClient(
		kgo.SeedBrokers(work.Bootstrap),
		kgo.DefaultProduceTopic(work.Topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(time.Second),
	)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	result := job.NewResult(len(work.Records))
	var wait sync.WaitGroup
	var lock sync.Mutex
	for n, r := range work.Records {
		record := &kgo.Record{Value: []byte(r.Value), Partition: 0}
		if r.Key != nil {
			record.Key = []byte(*r.Key)
		}
		wait.Add(1)
		client.Produce(context.Background(), record, func(_ *kgo.Record, err error) {
			defer wait.Done()
			if err != nil {
				lock.Lock()
				defer lock.Unlock()
				result.Fail(n, err)
			}
		})
	}
	if err := client.Flush(context.Background()); err != nil {
		panic(err)
	}
	wait.Wait()
	result.Print()
}
