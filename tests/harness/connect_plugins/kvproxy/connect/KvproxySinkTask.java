package kvproxy.connect;

import java.io.FileWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.io.Writer;
import java.util.Collection;
import java.util.Map;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/** Writes each record as it arrives (flushed at once, so a test can read the file meanwhile). */
public class KvproxySinkTask extends SinkTask {
    private Writer out;

    @Override public String version() { return "1"; }

    @Override public void start(Map<String, String> props) {
        try {
            out = new FileWriter(props.get("file"), true);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    @Override public void put(Collection<SinkRecord> records) {
        try {
            for (SinkRecord r : records) {
                out.write("{\"topic\": " + quote(r.topic()) + ", \"partition\": " + r.kafkaPartition()
                    + ", \"offset\": " + r.kafkaOffset() + ", \"key\": " + quote(r.key())
                    + ", \"value\": " + quote(r.value()) + "}\n");
            }
            out.flush();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static String quote(Object value) {
        if (value == null) {
            return "null";
        }
        StringBuilder s = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') {
                s.append('\\').append(c);
            } else if (c < 0x20) {
                s.append(String.format("\\u%04x", (int) c));
            } else {
                s.append(c);
            }
        }
        return s.append('"').toString();
    }

    @Override public void stop() {
        try {
            if (out != null) {
                out.close();
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
