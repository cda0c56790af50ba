// A hyperparameter tuning job: configuration, counters, the best trial, the trials table
// (ListTrainingJobsForHyperParameterTuningJob) and the objective over time.

import { useState } from "preact/hooks";
import { ApiError, Json, sagemaker } from "../api";
import { ChartFigure } from "../components/Charts";
import { FailureReason, Fields, Section, Status } from "../components/common";
import { DetailHeader, useDescribe } from "../components/describe";
import { Link } from "../router";
import { duration, fmtTime, usePoll } from "../util";

const MAX_TRIALS = 1000;

export function TuningJobPage(props: { name: string }) {
  const { name } = props;
  const isLive = (j: Json) => ["InProgress", "Stopping"].includes(j.HyperParameterTuningJobStatus);
  const { data: d, error, gone } = useDescribe("DescribeHyperParameterTuningJob", { HyperParameterTuningJobName: name }, "tuning job", isLive);
  const live = !!d && !gone && isLive(d);
  const [trials, setTrials] = useState<Json[] | null>(null);
  const [trialsError, setTrialsError] = useState<string | null>(null);
  usePoll(
    async () => {
      if (!d || gone) return !gone;
      try {
        const all: Json[] = [];
        let token: string | undefined;
        for (let i = 0; i < MAX_TRIALS / 100; i++) {
          const input: Record<string, unknown> = { HyperParameterTuningJobName: name, MaxResults: 100, SortBy: "CreationTime", SortOrder: "Ascending" };
          if (token) input.NextToken = token;
          const out = await sagemaker("ListTrainingJobsForHyperParameterTuningJob", input);
          all.push(...(out.TrainingJobSummaries || []));
          token = out.NextToken;
          if (!token) break;
        }
        setTrials(all);
        setTrialsError(null);
      } catch (e) {
        setTrialsError(e instanceof ApiError ? `${e.code}: ${e.message}` : String(e));
      }
      return live;
    },
    5000,
    [name, !!d, live, gone],
  );

  if (!d) return <DetailHeader kind="Tuning job" name={name} status={gone ? "Not found" : "Loading"} error={error} />;
  const cfg = d.HyperParameterTuningJobConfig || {};
  const objective = cfg.HyperParameterTuningJobObjective || {};
  const limits = cfg.ResourceLimits || {};
  const counters = d.TrainingJobStatusCounters || {};
  const best = d.BestTrainingJob;
  // The objective of each finished trial, by when it ended.
  const points = (trials || [])
    .filter((t) => t.FinalHyperParameterTuningJobObjectiveMetric && t.TrainingEndTime)
    .map((t) => [t.TrainingEndTime as number, t.FinalHyperParameterTuningJobObjectiveMetric.Value as number])
    .sort((a, b) => a[0] - b[0]);
  return (
    <>
      <DetailHeader kind="Tuning job" name={name} status={d.HyperParameterTuningJobStatus} error={error} />
      <FailureReason reason={d.FailureReason} />
      <Section title="Summary">
        <Fields
          rows={[
            ["ARN", <code class="wrap">{d.HyperParameterTuningJobArn}</code>],
            ["Strategy", cfg.Strategy],
            ["Objective", objective.MetricName ? `${objective.Type} ${objective.MetricName}` : undefined],
            ["Max trials", limits.MaxNumberOfTrainingJobs != null ? String(limits.MaxNumberOfTrainingJobs) : undefined],
            ["Parallel trials", limits.MaxParallelTrainingJobs != null ? String(limits.MaxParallelTrainingJobs) : undefined],
            ["Created", fmtTime(d.CreationTime)],
            ["Ended", fmtTime(d.HyperParameterTuningEndTime)],
            ["Duration", duration(d.CreationTime, d.HyperParameterTuningEndTime)],
            [
              "Trials",
              `${counters.Completed || 0} completed, ${counters.InProgress || 0} in progress, ${counters.Stopped || 0} stopped, ${
                (counters.RetryableError || 0) + (counters.NonRetryableError || 0)
              } failed`,
            ],
          ]}
        />
      </Section>
      <Section title="Best trial">
        {best ? (
          <Fields
            rows={[
              ["Training job", <Link to={`/training-jobs/${encodeURIComponent(best.TrainingJobName)}`}>{best.TrainingJobName}</Link>],
              [
                "Objective",
                best.FinalHyperParameterTuningJobObjectiveMetric
                  ? `${best.FinalHyperParameterTuningJobObjectiveMetric.MetricName} = ${best.FinalHyperParameterTuningJobObjectiveMetric.Value}`
                  : undefined,
              ],
              [
                "Hyperparameters",
                Object.entries(best.TunedHyperParameters || {})
                  .map(([k, v]) => `${k}=${v}`)
                  .join(", "),
              ],
            ]}
          />
        ) : (
          <p class="muted">No trial has reported the objective yet.</p>
        )}
      </Section>
      <Section title="Objective over time">
        <ChartFigure
          metric={objective.MetricName || "Objective"}
          xs={points.map((p) => p[0])}
          ys={points.map((p) => p[1])}
        />
      </Section>
      <Section title="Trials">
        {trialsError && <p class="error">{trialsError}</p>}
        {trials === null ? (
          <p class="muted">Loading…</p>
        ) : trials.length === 0 ? (
          <p class="muted">No trials yet.</p>
        ) : (
          <table class="kv" id="trials-table">
            <caption class="sr-only">Trials</caption>
            <thead>
              <tr>
                <th scope="col">Training job</th>
                <th scope="col">Status</th>
                <th scope="col">Objective</th>
                <th scope="col">Hyperparameters</th>
                <th scope="col">Duration</th>
              </tr>
            </thead>
            <tbody>
              {trials.map((t) => (
                <tr key={t.TrainingJobName} data-name={t.TrainingJobName}>
                  <th scope="row">
                    <Link to={`/training-jobs/${encodeURIComponent(t.TrainingJobName)}`}>{t.TrainingJobName}</Link>
                  </th>
                  <td>
                    <Status status={t.TrainingJobStatus} />
                  </td>
                  <td class="num">{t.FinalHyperParameterTuningJobObjectiveMetric?.Value ?? "—"}</td>
                  <td>
                    <code class="wrap">
                      {Object.entries(t.TunedHyperParameters || {})
                        .map(([k, v]) => `${k}=${v}`)
                        .join(", ")}
                    </code>
                  </td>
                  <td class="num">{duration(t.TrainingStartTime || t.CreationTime, t.TrainingEndTime)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Section>
    </>
  );
}
