// Produces the job's records in one batch with sarama 1.22's AsyncProducer (its defaults but for
// returning successes and a flush of all the job's records at once). The environment variable
// SARAMA_VERSION sets config.Version (the Kafka version the client assumes; 0.8.2 by default),
// SARAMA_ZSTD=1 compresses with zstd.
package main

import (
	"log"
	"os"
	"time"

	"github.com/Shopify/sarama"

	"kvproxy.test/goclients/job"
)

func main() {
	work := job.Read()
	sarama.Logger = log.New(os.Stderr, "", 0)
	config := sarama.NewConfig()
	var err error
	config.Producer.Return.Successes = true
	config.Producer.Partitioner = sarama.NewManualPartitioner
	config.Producer.Flush.Messages = len(work.Records)
	config.Producer.Flush.Frequency = time.Second
	if version := os.Getenv("SARAMA_VERSION"); version != "" {
		if config.Version, err = sarama.ParseKafkaVersion(version); err != nil {
			panic(err)
		}
	}
	if os.Getenv("SARAMA_ZSTD") == "1" {
		config.Producer.Compression = sarama.CompressionZSTD
	}
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
