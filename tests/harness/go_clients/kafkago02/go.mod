module kvproxy.test/goclients/kafkago02

go 1.26.0

require kvproxy.test/goclients/job v0.0.0

require (
	github.com/golang/snappy v1.0.0 // indirect
	github.com/pierrec/lz4 v2.6.1+incompatible // indirect
	github.com/segmentio/kafka-go v0.2.0
	golang.org/x/net v0.62.0 // indirect
)

replace kvproxy.test/goclients/job => ../job
