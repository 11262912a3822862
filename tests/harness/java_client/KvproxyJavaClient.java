import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;

/**
 * The Java client (kafka-clients) as an application uses it, driven by the test harness.
 *
 * <p>Usage: {@code KvproxyJavaClient COMMAND --bootstrap H:P [--name value]... [--prop k=v]...}.
 * Every command prints one JSON line on stdout (the client's own logging goes to stderr):
 *
 * <ul>
 *   <li>{@code produce --topic T --values V [--null-key true] [--timestamp MS] [--instance-id true]
 *       [--hold true]}: sends the values (V's lines; keys k0, k1, ...) without waiting between
 *       them, flushes, and reports each record's partition and offset or the exception its future
 *       and its callback got, and the client instance id telemetry gave it; with hold, the
 *       producer stays open after the report until stdin ends.
 *   <li>{@code transactions --topic T --transactional-id ID --commit N --abort M}: one transaction
 *       of N records committed, then one of M records aborted.
 *   <li>{@code consume --topic T --group G --members N}: N members of group G in one thread; each
 *       pauses what it is assigned until every member has partitions, then all consume until every
 *       partition's position reaches its end offset, commit, and report records, assignments and
 *       the committed offsets.
 *   <li>{@code versions}: the highest Produce version this client can send.
 *   <li>{@code nodes}: the brokers the Admin client's describeCluster names (id, host, port).
 * </ul>
 *
 * <p>{@link TelemetryReporter} is not part of the client: it is a broker's metrics reporter,
 * which a broker needs before it offers client telemetry (KIP-714) at all.
 */
public final class KvproxyJavaClient {
    private KvproxyJavaClient() {}

    public static void main(String[] argv) throws Exception {
        String command = argv[0];
        Map<String, String> args = new HashMap<>();
        Properties props = new Properties();
        for (int i = 1; i + 1 < argv.length; i += 2) {
            if (argv[i].equals("--prop")) {
                String[] kv = argv[i + 1].split("=", 2);
                props.put(kv[0], kv[1]);
            } else {
                args.put(argv[i].substring(2), argv[i + 1]);
            }
        }
        props.put("bootstrap.servers", args.get("bootstrap"));
        String out;
        switch (command) {
            case "produce":
                out = produce(args, props);
                break;
            case "transactions":
                out = transactions(args, props);
                break;
            case "consume":
                out = consume(args, props);
                break;
            case "versions":
                out = "{\"produce_latest\":" + ApiKeys.PRODUCE.latestVersion() + "}";
                break;
            case "nodes":
                out = nodes(props);
                break;
            default:
                throw new IllegalArgumentException("unknown command " + command);
        }
        if (out != null) {
            System.out.println(out);
            System.out.flush();
        }
    }

    private static String nodes(Properties props) throws Exception {
        try (Admin admin = Admin.create(props)) {
            List<String> nodes = new ArrayList<>();
            for (Node node : admin.describeCluster().nodes().get()) {
                nodes.add("[" + node.id() + "," + quote(node.host()) + "," + node.port() + "]");
            }
            return "{\"nodes\":[" + String.join(",", nodes) + "]}";
        }
    }

    private static KafkaProducer<String, String> producer(Properties props) {
        return new KafkaProducer<>(props, new StringSerializer(), new StringSerializer());
    }

    private static String produce(Map<String, String> args, Properties props) throws Exception {
        String topic = args.get("topic");
        boolean nullKey = Boolean.parseBoolean(args.getOrDefault("null-key", "false"));
        Long timestamp = args.containsKey("timestamp") ? Long.valueOf(args.get("timestamp")) : null;
        String[] values = args.get("values").split("\n", -1);
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        List<Exception> callbacks = new ArrayList<>();
        try (KafkaProducer<String, String> producer = producer(props)) {
            for (int i = 0; i < values.length; i++) {
                String key = nullKey ? null : "k" + i;
                final int index = i;
                callbacks.add(null);
                ProducerRecord<String, String> record =
                        new ProducerRecord<>(topic, null, timestamp, key, values[i]);
                futures.add(producer.send(record, (metadata, exception) -> {
                    synchronized (callbacks) {
                        callbacks.set(index, exception);
                    }
                }));
            }
            producer.flush();
            String instance = "null";
            if (Boolean.parseBoolean(args.getOrDefault("instance-id", "false"))) {
                Uuid id = producer.clientInstanceId(Duration.ofSeconds(30));
                instance = id == null ? "null" : quote(id.toString());
            }
            StringBuilder results = new StringBuilder("[");
            for (int i = 0; i < futures.size(); i++) {
                if (i > 0) {
                    results.append(',');
                }
                try {
                    RecordMetadata metadata = futures.get(i).get();
                    results.append("{\"partition\":").append(metadata.partition())
                            .append(",\"offset\":").append(metadata.offset());
                } catch (ExecutionException e) {
                    results.append("{\"error\":").append(describe(e.getCause()));
                }
                synchronized (callbacks) {
                    results.append(",\"callback_error\":").append(describe(callbacks.get(i)));
                }
                results.append('}');
            }
            String out = "{\"results\":" + results.append(']') + ",\"client_instance_id\":"
                    + instance + "}";
            if (Boolean.parseBoolean(args.getOrDefault("hold", "false"))) {
                // the caller decides when the producer closes: at the end of stdin
                System.out.println(out);
                System.out.flush();
                while (System.in.read() != -1) {
                    // wait
                }
                return null;
            }
            return out;
        }
    }

    private static String transactions(Map<String, String> args, Properties props) {
        String topic = args.get("topic");
        props.put("transactional.id", args.get("transactional-id"));
        int commit = Integer.parseInt(args.get("commit"));
        int abort = Integer.parseInt(args.get("abort"));
        try (KafkaProducer<String, String> producer = producer(props)) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < commit; i++) {
                producer.send(new ProducerRecord<>(topic, "c" + i, "committed-" + i));
            }
            producer.commitTransaction();
            producer.beginTransaction();
            for (int i = 0; i < abort; i++) {
                producer.send(new ProducerRecord<>(topic, "a" + i, "aborted-" + i));
            }
            producer.flush();
            producer.abortTransaction();
        }
        return "{\"committed\":" + commit + ",\"aborted\":" + abort + "}";
    }

    /**
     * A broker metrics reporter that accepts client telemetry: each push it is handed is appended
     * to the file named by the broker property {@code kvproxy.telemetry.file} as one line
     * "client-instance-id terminating content-type bytes".
     */
    public static final class TelemetryReporter
            implements MetricsReporter, ClientTelemetryExporterProvider, ClientTelemetryExporter {
        private String file;

        @Override
        public void configure(Map<String, ?> configs) {
            file = String.valueOf(configs.get("kvproxy.telemetry.file"));
        }

        @Override
        public void init(List<KafkaMetric> metrics) {}

        @Override
        public void metricChange(KafkaMetric metric) {}

        @Override
        public void metricRemoval(KafkaMetric metric) {}

        @Override
        public void close() {}

        @Override
        public ClientTelemetryExporter clientTelemetryExporter() {
            return this;
        }

        @Override
        public synchronized void exportMetrics(
                ClientTelemetryContext context, ClientTelemetryPayload payload) {
            String line = payload.clientInstanceId() + " " + payload.isTerminating() + " "
                    + payload.contentType() + " " + payload.data().remaining() + "\n";
            try {
                Files.write(Paths.get(file), line.getBytes(StandardCharsets.UTF_8),
                        StandardOpenOption.CREATE, StandardOpenOption.APPEND);
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        }
    }

    /** Pauses every partition as it is assigned, so no member reads before all have joined. */
    private static final class Pausing implements ConsumerRebalanceListener {
        KafkaConsumer<String, String> consumer;
        boolean hold = true;

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {}

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            if (hold) {
                consumer.pause(partitions);
            }
        }
    }

    private static String consume(Map<String, String> args, Properties props) {
        String topic = args.get("topic");
        int count = Integer.parseInt(args.getOrDefault("members", "1"));
        long deadline = System.currentTimeMillis()
                + Long.parseLong(args.getOrDefault("timeout-ms", "60000"));
        props.put("group.id", args.get("group"));
        props.putIfAbsent("auto.offset.reset", "earliest");
        props.putIfAbsent("enable.auto.commit", "false");
        List<KafkaConsumer<String, String>> members = new ArrayList<>();
        List<Pausing> listeners = new ArrayList<>();
        List<List<String>> records = new ArrayList<>();
        int rounds = 0;
        try {
            // Members join one after the other: each later one makes the group rebalance.
            for (int m = 0; m < count; m++) {
                Properties own = (Properties) props.clone();
                own.put("client.id", "member-" + m);
                KafkaConsumer<String, String> consumer = new KafkaConsumer<>(
                        own, new StringDeserializer(), new StringDeserializer());
                Pausing listener = new Pausing();
                listener.consumer = consumer;
                consumer.subscribe(List.of(topic), listener);
                members.add(consumer);
                listeners.add(listener);
                records.add(new ArrayList<>());
                int total = m + 1 == count ? partitionCount(consumer, topic) : 0;
                while (!allAssigned(members, total)) {
                    check(deadline, "members assigned");
                    for (KafkaConsumer<String, String> member : members) {
                        member.poll(Duration.ofMillis(100));
                    }
                    rounds++;
                }
            }
            for (int m = 0; m < count; m++) {
                listeners.get(m).hold = false;
                members.get(m).resume(members.get(m).assignment());
            }
            List<Set<TopicPartition>> assigned = new ArrayList<>();
            for (KafkaConsumer<String, String> member : members) {
                assigned.add(new HashSet<>(member.assignment()));
            }
            while (!atEnd(members)) {
                check(deadline, "records consumed");
                for (int m = 0; m < count; m++) {
                    Duration wait = Duration.ofMillis(100);
                    for (ConsumerRecord<String, String> r : members.get(m).poll(wait)) {
                        records.get(m).add("[" + quote(r.key()) + "," + quote(r.value()) + ","
                                + r.partition() + "," + r.offset() + "]");
                    }
                }
            }
            StringBuilder out = new StringBuilder("{\"members\":[");
            for (int m = 0; m < count; m++) {
                KafkaConsumer<String, String> member = members.get(m);
                member.commitSync();
                if (m > 0) {
                    out.append(',');
                }
                out.append("{\"assignment\":").append(partitions(assigned.get(m)))
                        .append(",\"records\":[").append(String.join(",", records.get(m)))
                        .append("],\"committed\":{");
                Map<TopicPartition, OffsetAndMetadata> committed =
                        member.committed(assigned.get(m));
                List<String> offsets = new ArrayList<>();
                for (Map.Entry<TopicPartition, OffsetAndMetadata> e : committed.entrySet()) {
                    offsets.add("\"" + e.getKey().partition() + "\":"
                            + (e.getValue() == null ? "null" : e.getValue().offset()));
                }
                out.append(String.join(",", offsets)).append("}}");
            }
            return out.append("],\"join_rounds\":").append(rounds).append('}').toString();
        } finally {
            for (KafkaConsumer<String, String> member : members) {
                member.close(Duration.ofSeconds(10));
            }
        }
    }

    private static int partitionCount(KafkaConsumer<String, String> consumer, String topic) {
        return consumer.partitionsFor(topic).size();
    }

    /** Every member has partitions, and together they hold `total` (0: do not count). */
    private static boolean allAssigned(List<KafkaConsumer<String, String>> members, int total) {
        int held = 0;
        for (KafkaConsumer<String, String> member : members) {
            if (member.assignment().isEmpty()) {
                return false;
            }
            held += member.assignment().size();
        }
        return total == 0 || held == total;
    }

    private static boolean atEnd(List<KafkaConsumer<String, String>> members) {
        for (KafkaConsumer<String, String> member : members) {
            Set<TopicPartition> assignment = member.assignment();
            Map<TopicPartition, Long> ends = member.endOffsets(assignment);
            for (TopicPartition tp : assignment) {
                if (member.position(tp) < ends.get(tp)) {
                    return false;
                }
            }
        }
        return true;
    }

    private static void check(long deadline, String what) {
        if (System.currentTimeMillis() > deadline) {
            throw new IllegalStateException("timed out waiting for " + what);
        }
    }

    private static String partitions(Set<TopicPartition> assignment) {
        List<String> numbers = new ArrayList<>();
        for (TopicPartition tp : assignment) {
            numbers.add(Integer.toString(tp.partition()));
        }
        return "[" + String.join(",", numbers) + "]";
    }

    private static String describe(Throwable error) {
        if (error == null) {
            return "null";
        }
        return "{\"class\":" + quote(error.getClass().getName()) + ",\"message\":"
                + quote(error.getMessage()) + "}";
    }

    private static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
