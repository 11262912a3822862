// Produces the job's records in one batch with sarama's AsyncProducer (its defaults but for
// returning successes and a flush of all the job's records at once).
package main

import (
	"log"
	"os"
	"time"

	"github.com/IBM/sarama"

	"kvproxy.test/goclients/job"
)

func main() {
	work := job.Read()
	sarama.Logger = log.New(os.Stderr, "", 0)
	config := sarama.NewConfig()
	config.Producer.Return.Successes = true
	config.Producer.Partitioner = sarama.NewManualPartitioner
	config.Producer.Flush.Messages = len(work.Records)
	config.Producer.Flush.Frequency = time.Second
	producer, err := sarama.NewAsyncProducer([]string{work.Bootstrap}, config)
	if err != nil {
		panic(err)
	}
	result := job.NewResult(len(work.Records))
	for n, r := range work.Records {
		message := &sarama.ProducerMessage{
			Topic: work.Topic, Partition: 0, Value: sarama.StringEncoder(r.Value), Metadata: n,
		}
		if r.Key != nil {
			message.Key = sarama.StringEncoder(*r.Key)
		}
		producer.Input() <- message
	}
	for range work.Records {
		select {
		case <-producer.Successes():
		case failed := <-producer.Errors():
			result.Fail(failed.Msg.Metadata.(int), failed.Err)
		}
	}
	if err := producer.Close(); err != nil {
		panic(err)
	}
	result.Print()
}
