// Produces the records read from stdin in one batch with kafkajs and prints what the
// application gets for each record (see tests/harness/client_programs.py for the JSON).
"use strict";
const { Kafka, Partitioners, logLevel } = require("kafkajs");

const LEVELS = { [logLevel.ERROR]: "ERROR", [logLevel.WARN]: "WARN" };

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;
  const job = JSON.parse(input);
  const kafka = new Kafka({
    clientId: "kafkajs",
    brokers: [job.bootstrap],
    logLevel: logLevel.WARN,
    logCreator: () => ({ level, log }) => {
      const { message, ...rest } = log;
      const { timestamp: _, ...fields } = rest;
      process.stderr.write(`${LEVELS[level] ?? level} ${message} ${JSON.stringify(fields)}\n`);
    },
  });
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  const messages = job.records.map((r) => ({ key: r.key, value: r.value, partition: 0 }));
  let error = null;
  let kind = null;
  try {
    await producer.send({ topic: job.topic, messages });
  } catch (e) {
    error = `${e.name}: ${e.message}`;
    kind = `${e.name} type=${e.type} code=${e.code} retriable=${e.retriable}`;
  }
  await producer.disconnect();
  // one send, one answer: every record of it gets the same
  const result = {
    errors: job.records.map(() => error),
    types: job.records.map(() => kind),
  };
  process.stdout.write(JSON.stringify(result) + "\n");
}

main().catch((e) => {
  process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
