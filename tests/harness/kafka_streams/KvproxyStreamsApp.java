import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.ErrorHandlerContext;
import org.apache.kafka.streams.errors.ProductionExceptionHandler;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * A Kafka Streams application as one is written, driven by the test harness.
 *
 * <p>Usage: {@code KvproxyStreamsApp --bootstrap H:P --app-id ID --input T --output T
 * [--protocol classic|streams] [--handler default|continue] [--prop k=v]...}. The topology counts
 * the input's values by their first word ({@code "apple:1"} counts under {@code apple}): the new
 * key goes through a repartition topic, the counts live in a state store whose changelog topic is
 * compacted, and each count goes to the output topic under its word, with exactly_once_v2. It
 * runs until stdin ends, printing one JSON line per event: a state change, a call of the
 * production exception handler, an uncaught exception (answered SHUTDOWN_CLIENT), and at the end
 * the state it closed in.
 */
public final class KvproxyStreamsApp {
    private KvproxyStreamsApp() {}

    /** Continues past a record the broker refused, as an application that accepts losing it. */
    public static final class ContinueHandler implements ProductionExceptionHandler {
        @Override
        public Response handleError(
                ErrorHandlerContext context, ProducerRecord<byte[], byte[]> record, Exception e) {
            event("handler", "{\"exception\":" + quote(e.getClass().getName())
                    + ",\"message\":" + quote(String.valueOf(e.getMessage()))
                    + ",\"topic\":" + quote(record.topic()) + "}");
            return Response.resume();
        }

        @Override
        public void configure(Map<String, ?> configs) {}
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        Properties props = new Properties();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (argv[i].equals("--prop")) {
                String[] kv = argv[i + 1].split("=", 2);
                props.put(kv[0], kv[1]);
            } else {
                args.put(argv[i].substring(2), argv[i + 1]);
            }
        }
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("app-id"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put("group.protocol", args.getOrDefault("protocol", "classic"));
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0"); // a count per record
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "100");
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
        props.put(StreamsConfig.STATE_DIR_CONFIG,
                Files.createTempDirectory("kvproxy-streams-").toString());
        if (args.getOrDefault("handler", "default").equals("continue")) {
            props.put(StreamsConfig.PRODUCTION_EXCEPTION_HANDLER_CLASS_CONFIG,
                    ContinueHandler.class.getName());
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args.get("input"), Consumed.with(Serdes.String(), Serdes.String()))
                .selectKey((key, value) -> value.split(":", 2)[0])
                .groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .count(Materialized.as("counts"))
                .toStream()
                .mapValues(count -> Long.toString(count))
                .to(args.get("output"), Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setStateListener((now, before) -> event("state",
                "{\"from\":" + quote(before.name()) + ",\"to\":" + quote(now.name()) + "}"));
        streams.setUncaughtExceptionHandler(e -> {
            StringBuilder causes = new StringBuilder();
            for (Throwable t = e; t != null; t = t.getCause()) {
                causes.append(causes.length() == 0 ? "" : ",").append("{\"exception\":")
                        .append(quote(t.getClass().getName())).append(",\"message\":")
                        .append(quote(String.valueOf(t.getMessage()))).append("}");
            }
            event("uncaught", "{\"causes\":[" + causes + "]}");
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        BufferedReader stdin =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        while (stdin.readLine() != null) {
            // the test ends the application by closing stdin
        }
        streams.close(java.time.Duration.ofSeconds(30));
        event("closed", "{\"state\":" + quote(streams.state().name()) + "}");
    }

    private static synchronized void event(String kind, String json) {
        System.out.println("{\"event\":" + quote(kind) + ",\"data\":" + json + "}");
        System.out.flush();
    }

    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
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
