// A training job: configuration, the secondary-status timeline, the live log tail, a chart per
// MetricDefinition plus the hosts' instance metrics, artifacts, and the Connect panel.

import { useState } from "preact/hooks";
import { Json } from "../api";
import { MetricCharts, MetricSpec } from "../components/Charts";
import { FailureReason, Fields, KeyValueTable, S3Link, Section } from "../components/common";
import { ConnectPanel, DetailHeader, useDescribe } from "../components/describe";
import { LogTail } from "../components/LogTail";
import { Link } from "../router";
import { duration, fmtDuration, fmtTime } from "../util";

export const TRAINING_NS = "/aws/sagemaker/TrainingJobs";
const INSTANCE_METRICS: [string, boolean][] = [
  ["CPUUtilization", false],
  ["MemoryUtilization", false],
  ["DiskUtilization", false],
  ["GPUUtilization", true],
  ["GPUMemoryUtilization", true],
];

export function Timeline(props: { transitions?: Json[] }) {
  const list = props.transitions || [];
  if (list.length === 0) return <p class="muted">No status transitions yet.</p>;
  return (
    <ol class="timeline">
      {list.map((t, i) => (
        <li key={i} class={t.EndTime ? "done" : "current"}>
          <span class="t-status">{t.Status}</span>
          <span class="t-time">
            {fmtTime(t.StartTime)}
            {t.EndTime ? ` → ${fmtTime(t.EndTime)} (${fmtDuration(t.EndTime - t.StartTime)})` : " → now"}
          </span>
          {t.StatusMessage && <span class="t-message">{t.StatusMessage}</span>}
        </li>
      ))}
    </ol>
  );
}

export function TrainingJobPage(props: { name: string }) {
  const { name } = props;
  const { data: d, error, gone } = useDescribe("DescribeTrainingJob", { TrainingJobName: name }, "training job", (j) =>
    ["InProgress", "Stopping"].includes(j.TrainingJobStatus),
  );
  const [host, setHost] = useState(1);
  const live = !!d && !gone && ["InProgress", "Stopping"].includes(d.TrainingJobStatus);

  if (!d) {
    return (
      <>
        <DetailHeader kind="Training job" name={name} status={gone ? "Not found" : "Loading"} error={error} />
      </>
    );
  }
  const algo = d.AlgorithmSpecification || {};
  const rc = d.ResourceConfig || {};
  const start = d.TrainingStartTime || d.CreationTime;
  const end = live ? undefined : d.TrainingEndTime || d.LastModifiedTime;
  const count = rc.InstanceCount || 1;
  const metricSpecs: MetricSpec[] = (algo.MetricDefinitions || []).map((m: Json) => ({
    id: "def:" + m.Name,
    namespace: TRAINING_NS,
    metric: m.Name,
    dimensions: { TrainingJobName: name },
    stat: "Average",
  }));
  const instanceSpecs: MetricSpec[] = INSTANCE_METRICS.map(([metric, gpu]) => ({
    id: `host${host}:${metric}`,
    namespace: TRAINING_NS,
    metric,
    dimensions: { Host: `${name}/algo-${host}` },
    stat: "Average",
    unit: "%",
    hideEmpty: gpu,
    extra: { "data-host": `algo-${host}` },
  }));
  const output = d.OutputDataConfig?.S3OutputPath;
  const outputUri = output ? output.replace(/\/?$/, "/") + name + "/" : undefined;

  return (
    <>
      <DetailHeader kind="Training job" name={name} status={d.TrainingJobStatus} error={error}>
        {d.SecondaryStatus && <span class="secondary"> · {d.SecondaryStatus}</span>}
      </DetailHeader>
      <FailureReason reason={d.FailureReason} />
      <div class="split">
        <Section title="Summary">
          <Fields
            rows={[
              ["ARN", <code class="wrap">{d.TrainingJobArn}</code>],
              ["Created", fmtTime(d.CreationTime)],
              ["Started", fmtTime(d.TrainingStartTime)],
              ["Ended", fmtTime(d.TrainingEndTime)],
              ["Duration", duration(d.CreationTime, d.TrainingEndTime)],
              ["Training time", d.TrainingTimeInSeconds != null ? fmtDuration(d.TrainingTimeInSeconds) : undefined],
              ["Billable time", d.BillableTimeInSeconds != null ? fmtDuration(d.BillableTimeInSeconds) : undefined],
              ["Tuning job", d.TuningJobArn ? <Link to={`/tuning-jobs/${encodeURIComponent(d.TuningJobArn.split("/").pop())}`}>{d.TuningJobArn.split("/").pop()}</Link> : undefined],
              ["Warm pool", d.WarmPoolStatus?.Status],
            ]}
          />
          {(d.FinalMetricDataList || []).length > 0 && (
            <>
              <h3>Final metrics</h3>
              <Fields rows={d.FinalMetricDataList.map((m: Json) => [m.MetricName, String(m.Value)] as [string, string])} />
            </>
          )}
        </Section>
        <Section title="Status timeline">
          <Timeline transitions={d.SecondaryStatusTransitions} />
        </Section>
      </div>
      <Section title="Metrics">
        {metricSpecs.length === 0 ? (
          <p class="muted">The job defines no metrics (AlgorithmSpecification.MetricDefinitions).</p>
        ) : (
          <MetricCharts specs={metricSpecs} start={start} end={end} live={live} />
        )}
      </Section>
      <Section title="Logs">
        <LogTail group={TRAINING_NS} prefix={`${name}/`} live={live} emptyText="No log stream yet: the job has not started a host." />
      </Section>
      <Section title="Instance metrics">
        {count > 1 && (
          <p>
            <label for="metrics-host">Host</label>{" "}
            <select id="metrics-host" value={String(host)} onChange={(e) => setHost(Number((e.target as HTMLSelectElement).value))}>
              {Array.from({ length: count }, (_, i) => (
                <option key={i} value={String(i + 1)}>
                  algo-{i + 1}
                </option>
              ))}
            </select>
          </p>
        )}
        <MetricCharts specs={instanceSpecs} start={start} end={end} live={live} />
      </Section>
      <Section title="Configuration">
        <Fields
          rows={[
            ["Image", algo.TrainingImage ? <code class="wrap">{algo.TrainingImage}</code> : algo.AlgorithmName],
            ["Input mode", algo.TrainingInputMode],
            ["Entrypoint", algo.ContainerEntrypoint ? <code>{algo.ContainerEntrypoint.join(" ")}</code> : undefined],
            ["Arguments", algo.ContainerArguments ? <code>{algo.ContainerArguments.join(" ")}</code> : undefined],
            ["Instance type", rc.InstanceType],
            ["Instance count", rc.InstanceCount != null ? String(rc.InstanceCount) : undefined],
            ["Volume", rc.VolumeSizeInGB != null ? `${rc.VolumeSizeInGB} GB` : undefined],
            ["Keep-alive", rc.KeepAlivePeriodInSeconds ? fmtDuration(rc.KeepAlivePeriodInSeconds) : undefined],
            ["Max runtime", d.StoppingCondition?.MaxRuntimeInSeconds ? fmtDuration(d.StoppingCondition.MaxRuntimeInSeconds) : undefined],
            ["Spot training", d.EnableManagedSpotTraining ? "yes" : undefined],
            ["Network isolation", d.EnableNetworkIsolation ? "yes" : undefined],
            ["Role", d.RoleArn ? <code class="wrap">{d.RoleArn}</code> : undefined],
          ]}
        />
        <h3>Hyperparameters</h3>
        <KeyValueTable data={d.HyperParameters} caption="Hyperparameters" empty="No hyperparameters." />
        <h3>Input channels</h3>
        <Channels channels={d.InputDataConfig} />
        {d.Environment && Object.keys(d.Environment).length > 0 && (
          <>
            <h3>Environment</h3>
            <KeyValueTable data={d.Environment} caption="Environment" />
          </>
        )}
      </Section>
      <Section title="Artifacts">
        <Fields
          rows={[
            ["Model artifacts", d.ModelArtifacts?.S3ModelArtifacts ? <S3Link uri={d.ModelArtifacts.S3ModelArtifacts} download /> : "—"],
            ["Output", outputUri ? <S3Link uri={outputUri} /> : undefined],
            ["Checkpoints", d.CheckpointConfig?.S3Uri ? <S3Link uri={d.CheckpointConfig.S3Uri} /> : undefined],
            ["TensorBoard", d.TensorBoardOutputConfig?.S3OutputPath ? <S3Link uri={d.TensorBoardOutputConfig.S3OutputPath} /> : undefined],
          ]}
        />
      </Section>
      <ConnectPanel
        resource={`training-job/${name}`}
        live={live}
        enableHint={`Enable it on a running job with: aws sagemaker update-training-job --training-job-name ${name} --remote-debug-config EnableRemoteDebug=true`}
      />
    </>
  );
}

function Channels(props: { channels?: Json[] }) {
  const list = props.channels || [];
  if (list.length === 0) return <p class="muted">No input channels.</p>;
  return (
    <table class="kv">
      <caption class="sr-only">Input channels</caption>
      <thead>
        <tr>
          <th scope="col">Channel</th>
          <th scope="col">Source</th>
          <th scope="col">Content type</th>
          <th scope="col">Mode</th>
        </tr>
      </thead>
      <tbody>
        {list.map((c) => (
          <tr key={c.ChannelName}>
            <th scope="row">{c.ChannelName}</th>
            <td>
              {c.DataSource?.S3DataSource ? (
                <S3Link uri={c.DataSource.S3DataSource.S3Uri} />
              ) : c.DataSource?.FileSystemDataSource ? (
                <code>{c.DataSource.FileSystemDataSource.DirectoryPath}</code>
              ) : (
                "—"
              )}
            </td>
            <td>{c.ContentType || "—"}</td>
            <td>{c.InputMode || "—"}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
