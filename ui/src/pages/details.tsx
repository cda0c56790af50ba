// Detail pages of models, endpoint configs, processing jobs and transform jobs.

import { Json } from "../api";
import { FailureReason, Fields, KeyValueTable, S3Link, Section } from "../components/common";
import { DetailHeader, useDescribe } from "../components/describe";
import { LogTail } from "../components/LogTail";
import { Link } from "../router";
import { duration, fmtDuration, fmtTime } from "../util";

const JOB_LIVE = (status: string) => status === "InProgress" || status === "Stopping";

function Containers(props: { containers: Json[] }) {
  return (
    <>
      {props.containers.map((c, i) => (
        <div key={i} class="container-def">
          {props.containers.length > 1 && <h3>Container {c.ContainerHostname || i + 1}</h3>}
          <Fields
            rows={[
              ["Image", c.Image ? <code class="wrap">{c.Image}</code> : undefined],
              ["Model data", c.ModelDataUrl ? <S3Link uri={c.ModelDataUrl} download /> : c.ModelDataSource?.S3DataSource ? <S3Link uri={c.ModelDataSource.S3DataSource.S3Uri} /> : undefined],
              ["Mode", c.Mode],
              ["Hostname", c.ContainerHostname],
            ]}
          />
          {c.Environment && Object.keys(c.Environment).length > 0 && (
            <>
              <h4>Environment</h4>
              <KeyValueTable data={c.Environment} caption="Environment" />
            </>
          )}
        </div>
      ))}
    </>
  );
}

export function ModelPage(props: { name: string }) {
  const { data: d, error, gone } = useDescribe("DescribeModel", { ModelName: props.name }, "model", () => false);
  if (!d) return <DetailHeader kind="Model" name={props.name} status={gone ? "Not found" : undefined} error={error} />;
  const containers: Json[] = d.PrimaryContainer ? [d.PrimaryContainer] : d.Containers || [];
  return (
    <>
      <DetailHeader kind="Model" name={props.name} error={error} />
      <Section title="Summary">
        <Fields
          rows={[
            ["ARN", <code class="wrap">{d.ModelArn}</code>],
            ["Created", fmtTime(d.CreationTime)],
            ["Execution role", d.ExecutionRoleArn ? <code class="wrap">{d.ExecutionRoleArn}</code> : undefined],
            ["Network isolation", d.EnableNetworkIsolation ? "yes" : "no"],
            ["Inference mode", d.InferenceExecutionConfig?.Mode],
          ]}
        />
      </Section>
      <Section title="Containers">
        <Containers containers={containers} />
      </Section>
    </>
  );
}

export function EndpointConfigPage(props: { name: string }) {
  const { data: d, error, gone } = useDescribe("DescribeEndpointConfig", { EndpointConfigName: props.name }, "endpoint config", () => false);
  if (!d) return <DetailHeader kind="Endpoint config" name={props.name} status={gone ? "Not found" : undefined} error={error} />;
  const variants: Json[] = [...(d.ProductionVariants || []), ...(d.ShadowProductionVariants || []).map((v: Json) => ({ ...v, shadow: true }))];
  return (
    <>
      <DetailHeader kind="Endpoint config" name={props.name} error={error} />
      <Section title="Summary">
        <Fields
          rows={[
            ["ARN", <code class="wrap">{d.EndpointConfigArn}</code>],
            ["Created", fmtTime(d.CreationTime)],
            ["Data capture", d.DataCaptureConfig ? <S3Link uri={d.DataCaptureConfig.DestinationS3Uri} /> : undefined],
            ["Async output", d.AsyncInferenceConfig?.OutputConfig?.S3OutputPath ? <S3Link uri={d.AsyncInferenceConfig.OutputConfig.S3OutputPath} /> : undefined],
          ]}
        />
      </Section>
      <Section title="Variants">
        <table class="kv">
          <caption class="sr-only">Variants</caption>
          <thead>
            <tr>
              <th scope="col">Variant</th>
              <th scope="col">Model</th>
              <th scope="col">Instance type</th>
              <th scope="col">Initial count</th>
              <th scope="col">Weight</th>
              <th scope="col">Remote access</th>
            </tr>
          </thead>
          <tbody>
            {variants.map((v) => (
              <tr key={v.VariantName}>
                <th scope="row">
                  {v.VariantName}
                  {v.shadow ? " (shadow)" : ""}
                </th>
                <td>
                  <Link to={`/models/${encodeURIComponent(v.ModelName)}`}>{v.ModelName}</Link>
                </td>
                <td>{v.ServerlessConfig ? `serverless (${v.ServerlessConfig.MemorySizeInMB} MB)` : v.InstanceType || "—"}</td>
                <td class="num">{v.InitialInstanceCount ?? "—"}</td>
                <td class="num">{v.InitialVariantWeight ?? "—"}</td>
                <td>{v.EnableSSMAccess ? "enabled" : "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
    </>
  );
}

export function ProcessingJobPage(props: { name: string }) {
  const { name } = props;
  const { data: d, error, gone } = useDescribe("DescribeProcessingJob", { ProcessingJobName: name }, "processing job", (j) => JOB_LIVE(j.ProcessingJobStatus));
  if (!d) return <DetailHeader kind="Processing job" name={name} status={gone ? "Not found" : "Loading"} error={error} />;
  const live = !gone && JOB_LIVE(d.ProcessingJobStatus);
  const app = d.AppSpecification || {};
  const cluster = d.ProcessingResources?.ClusterConfig || {};
  return (
    <>
      <DetailHeader kind="Processing job" name={name} status={d.ProcessingJobStatus} error={error} />
      <FailureReason reason={d.FailureReason} />
      <Section title="Summary">
        <Fields
          rows={[
            ["ARN", <code class="wrap">{d.ProcessingJobArn}</code>],
            ["Created", fmtTime(d.CreationTime)],
            ["Started", fmtTime(d.ProcessingStartTime)],
            ["Ended", fmtTime(d.ProcessingEndTime)],
            ["Duration", duration(d.CreationTime, d.ProcessingEndTime)],
            ["Exit message", d.ExitMessage],
            ["Image", app.ImageUri ? <code class="wrap">{app.ImageUri}</code> : undefined],
            ["Entrypoint", app.ContainerEntrypoint ? <code>{app.ContainerEntrypoint.join(" ")}</code> : undefined],
            ["Arguments", app.ContainerArguments ? <code>{app.ContainerArguments.join(" ")}</code> : undefined],
            ["Instances", cluster.InstanceType ? `${cluster.InstanceCount} × ${cluster.InstanceType}` : undefined],
            ["Max runtime", d.StoppingCondition?.MaxRuntimeInSeconds ? fmtDuration(d.StoppingCondition.MaxRuntimeInSeconds) : undefined],
          ]}
        />
      </Section>
      <Section title="Inputs and outputs">
        <table class="kv">
          <caption class="sr-only">Inputs and outputs</caption>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Direction</th>
              <th scope="col">S3</th>
              <th scope="col">Local path</th>
            </tr>
          </thead>
          <tbody>
            {(d.ProcessingInputs || []).map((i: Json) => (
              <tr key={"in:" + i.InputName}>
                <th scope="row">{i.InputName}</th>
                <td>input</td>
                <td>
                  <S3Link uri={i.S3Input?.S3Uri} />
                </td>
                <td>
                  <code>{i.S3Input?.LocalPath || "—"}</code>
                </td>
              </tr>
            ))}
            {(d.ProcessingOutputConfig?.Outputs || []).map((o: Json) => (
              <tr key={"out:" + o.OutputName}>
                <th scope="row">{o.OutputName}</th>
                <td>output</td>
                <td>
                  <S3Link uri={o.S3Output?.S3Uri} />
                </td>
                <td>
                  <code>{o.S3Output?.LocalPath || "—"}</code>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
        {d.Environment && Object.keys(d.Environment).length > 0 && (
          <>
            <h3>Environment</h3>
            <KeyValueTable data={d.Environment} caption="Environment" />
          </>
        )}
      </Section>
      <Section title="Logs">
        <LogTail group="/aws/sagemaker/ProcessingJobs" prefix={`${name}/`} live={live} />
      </Section>
    </>
  );
}

export function TransformJobPage(props: { name: string }) {
  const { name } = props;
  const { data: d, error, gone } = useDescribe("DescribeTransformJob", { TransformJobName: name }, "transform job", (j) => JOB_LIVE(j.TransformJobStatus));
  if (!d) return <DetailHeader kind="Transform job" name={name} status={gone ? "Not found" : "Loading"} error={error} />;
  const live = !gone && JOB_LIVE(d.TransformJobStatus);
  const res = d.TransformResources || {};
  return (
    <>
      <DetailHeader kind="Transform job" name={name} status={d.TransformJobStatus} error={error} />
      <FailureReason reason={d.FailureReason} />
      <Section title="Summary">
        <Fields
          rows={[
            ["ARN", <code class="wrap">{d.TransformJobArn}</code>],
            ["Model", <Link to={`/models/${encodeURIComponent(d.ModelName)}`}>{d.ModelName}</Link>],
            ["Created", fmtTime(d.CreationTime)],
            ["Started", fmtTime(d.TransformStartTime)],
            ["Ended", fmtTime(d.TransformEndTime)],
            ["Duration", duration(d.CreationTime, d.TransformEndTime)],
            ["Instances", res.InstanceType ? `${res.InstanceCount} × ${res.InstanceType}` : undefined],
            ["Batch strategy", d.BatchStrategy],
            ["Max concurrent", d.MaxConcurrentTransforms != null ? String(d.MaxConcurrentTransforms) : undefined],
            ["Max payload", d.MaxPayloadInMB != null ? `${d.MaxPayloadInMB} MB` : undefined],
            ["Input", <S3Link uri={d.TransformInput?.DataSource?.S3DataSource?.S3Uri} />],
            ["Content type", d.TransformInput?.ContentType],
            ["Split type", d.TransformInput?.SplitType],
            ["Output", <S3Link uri={d.TransformOutput?.S3OutputPath} />],
          ]}
        />
      </Section>
      <Section title="Logs">
        <LogTail group="/aws/sagemaker/TransformJobs" prefix={`${name}/`} live={live} />
      </Section>
    </>
  );
}
