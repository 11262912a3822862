"""kvproxy's own Kafka client: the requests the proxy, the audit and the offline commands make of
a cluster on their own behalf (Metadata, DescribeConfigs, ListOffsets, Fetch, Produce).

`core` is sans-IO: it frames requests, correlates and decodes their answers and chooses the
version of an API that a broker and kvproxy share. Two thin drivers carry its bytes: `blocking`
(sockets, for the audit on Spark's driver and executors, which have no event loop) and
`async_connections` with `async_requests` (asyncio, for the proxy and the offline commands).
"""
