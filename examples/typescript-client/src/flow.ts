// A client of the Agent Jobs API, typed by the types openapi-typescript generates from GET /openapi.json at its default
// options (src/schema.d.ts, `npm run generate`), calling it with openapi-fetch: register a workspace, submit jobs one
// at a time and in a batch, read a job, page through the workspace's timeline. Each request sends only the fields it
// needs: the others are optional in the generated types, as the API takes them.
//
//   npm ci && npm run generate && npm run build
//   node dist/flow.js settings.json   # {"baseUrl", "token", "workspaceId", "remoteUrl"}
//
// Prints one JSON line per step; exits 1 at the first answer that is not the documented one.

import { readFileSync } from "node:fs";
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type JobRequest = components["schemas"]["ApplyPatchJob"] | components["schemas"]["RunTestsJob"] | components["schemas"]["OpenPrJob"];

interface Settings {
  baseUrl: string;
  token: string;
  workspaceId: string;
  remoteUrl: string;
}

const settings = JSON.parse(readFileSync(process.argv[2], "utf8")) as Settings;
const { workspaceId } = settings;
const client = createClient<paths>({
  baseUrl: settings.baseUrl,
  headers: { Authorization: `Bearer ${settings.token}` },
});

function expect(condition: boolean, what: string, answer: unknown): asserts condition {
  if (!condition) {
    console.error(`unexpected answer: ${what}: ${JSON.stringify(answer)}`);
    process.exit(1);
  }
}

function step(name: string, facts: Record<string, unknown>): void {
  console.log(JSON.stringify({ step: name, ...facts }));
}

const patch = (line: string): string => `--- a/notes.txt\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+${line}\n`;

// A registration with what the jobs below need besides its two required fields: the test suite a run_tests job runs
// when it names none ("default"), and the GitHub repository an open_pr job opens its pull request on (the API refuses
// a job its workspace cannot run). baseBranch is left out: the API uses "main".
const registered = await client.PUT("/workspaces/{workspaceId}", {
  params: { path: { workspaceId } },
  body: {
    remoteUrl: settings.remoteUrl,
    branch: "agent/typescript",
    testCommands: { default: ["npm", "test"] },
    githubRepository: "agents/typescript",
  },
});
expect(registered.response.status === 201 && registered.data !== undefined, "register", registered.error);
step("registerWorkspace", {
  status: registered.response.status,
  baseBranch: registered.data.baseBranch,
  location: registered.response.headers.get("location"),
});

// A run_tests job without a payload, an apply_patch job without patchEncoding or author.
const single: JobRequest[] = [
  { jobId: "ts-tests-1", workspaceId, type: "run_tests" },
  { jobId: "ts-patch-1", workspaceId, type: "apply_patch", payload: { patch: patch("one"), commitMessage: "one" } },
];
for (const job of single) {
  const submitted = await client.POST("/jobs", { body: job });
  expect(submitted.response.status === 202 && submitted.data !== undefined, `submit ${job.jobId}`, submitted.error);
  step("submitJob", { jobId: submitted.data.jobId, status: submitted.data.status, created: submitted.data.created });
}

// The same job again is the same job (202, created false); another job under its jobId is a 409 naming it.
const again = await client.POST("/jobs", { body: { jobId: "ts-tests-1", workspaceId, type: "run_tests", payload: {} } });
expect(again.response.status === 202 && again.data !== undefined, "resubmit", again.error);
step("submitJob", { jobId: again.data.jobId, status: again.data.status, created: again.data.created });
const conflict = await client.POST("/jobs", {
  body: { jobId: "ts-tests-1", workspaceId, type: "run_tests", payload: { suite: "lint" } },
});
expect(conflict.response.status === 409 && conflict.error !== undefined, "conflict", conflict.data);
const conflictView = conflict.error as components["schemas"]["ConflictView"];
step("submitJobConflict", { status: conflict.response.status, jobId: conflictView.jobId });

// A batch: an open_pr job without a body, an apply_patch job.
const batch = await client.POST("/jobs:batch", {
  body: {
    jobs: [
      { jobId: "ts-pr-1", workspaceId, type: "open_pr", payload: { title: "Agent changes" } },
      { jobId: "ts-patch-2", workspaceId, type: "apply_patch", payload: { patch: patch("two"), commitMessage: "two" } },
    ],
  },
});
expect(batch.response.status === 200 && batch.data !== undefined, "batch", batch.error);
step("submitJobBatch", {
  results: batch.data.results.map((result) => ({ jobId: result.jobId, statusCode: result.statusCode, created: result.created })),
});

const read = await client.GET("/jobs/{jobId}", { params: { path: { jobId: "ts-patch-1" } } });
expect(read.response.status === 200 && read.data !== undefined, "read", read.error);
step("readJob", { jobId: read.data.jobId, type: read.data.type, status: read.data.status, workspaceId: read.data.workspaceId });

const missing = await client.GET("/jobs/{jobId}", { params: { path: { jobId: "ts-never-sent" } } });
expect(missing.response.status === 404 && missing.error !== undefined, "read a job never sent", missing.data);
step("readJobMissing", { status: missing.response.status, hasMessage: typeof missing.error.message === "string" });

// The timeline, two jobs a page, following nextToken to the last page. The index behind it is eventually consistent:
// the timeline is read again, a moment later, until it holds every job submitted.
async function timelinePage(nextToken: string | undefined): Promise<{ jobIds: string[]; nextToken: string | undefined }> {
  const page = await client.GET("/workspaces/{workspaceId}/jobs", {
    params: { path: { workspaceId }, query: { limit: 2, nextToken } },
  });
  expect(page.response.status === 200 && page.data !== undefined, "timeline page", page.error);
  return { jobIds: page.data.jobs.map((job) => job.jobId ?? ""), nextToken: page.data.nextToken ?? undefined };
}

const submitted = 4;
let pages: string[][] = [];
for (let attempt = 0; attempt < 50 && pages.flat().length < submitted; attempt++) {
  if (attempt > 0) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  pages = [];
  let nextToken: string | undefined;
  do {
    const page = await timelinePage(nextToken);
    pages.push(page.jobIds);
    nextToken = page.nextToken;
  } while (nextToken !== undefined);
}
step("listWorkspaceJobs", { pages });
