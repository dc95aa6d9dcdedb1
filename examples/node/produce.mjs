// Send jobs straight to the Agent Jobs queue with the AWS SDK for JavaScript v3.
// One message group per workspace: its jobs run one at a time, in the order sent.
//   JOBS_QUEUE_URL=... node produce.mjs jobs.json   (a JSON list of {jobId, workspaceId, tenantId, type, payload})
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { SQSClient, SendMessageCommand } from "@aws-sdk/client-sqs";

// AWS_ENDPOINT_URL is only for a local emulator; in AWS the SDK finds the endpoint itself.
const sqs = new SQSClient({ endpoint: process.env.AWS_ENDPOINT_URL });

export async function sendJob(queueUrl, { jobId, workspaceId, tenantId, type, payload }) {
  const { MessageId, SequenceNumber } = await sqs.send(
    new SendMessageCommand({
      QueueUrl: queueUrl,
      MessageBody: JSON.stringify({ jobId, workspaceId, tenantId, type, payload }),
      MessageGroupId: `ws#${workspaceId}`,
      // The same for every send of one job: a resend within five minutes is dropped by SQS, a later one by the worker.
      MessageDeduplicationId: createHash("sha256").update(`${jobId}:${type}`).digest("hex"),
      MessageAttributes: {
        tenantId: { DataType: "String", StringValue: tenantId },
        type: { DataType: "String", StringValue: type },
      },
    }),
  );
  return { jobId, messageId: MessageId, sequenceNumber: SequenceNumber };
}

if (process.argv[2]) {
  for (const job of JSON.parse(readFileSync(process.argv[2], "utf8"))) {
    // One at a time: a workspace's jobs take effect in the order the queue received them.
    console.log(JSON.stringify(await sendJob(process.env.JOBS_QUEUE_URL, job)));
  }
}
