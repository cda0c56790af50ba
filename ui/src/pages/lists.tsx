// The list pages: one ListConfig per resource kind (the List* operation, its result member, the
// statuses StatusEquals takes, the sortable columns by SortBy value).

import { Json } from "../api";
import { Status } from "../components/common";
import type { ListConfig } from "../components/ListPage";
import { duration, fmtTime } from "../util";

const created = { label: "Created", sortBy: "CreationTime", render: (r: Json) => fmtTime(r.CreationTime), class: "time" };
const JOB_STATUSES = ["InProgress", "Completed", "Failed", "Stopping", "Stopped"];

export const trainingJobs: ListConfig = {
  title: "Training jobs",
  operation: "ListTrainingJobs",
  resultKey: "TrainingJobSummaries",
  nameKey: "TrainingJobName",
  route: "/training-jobs",
  statuses: JOB_STATUSES,
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.TrainingJobName, class: "name" },
    { label: "Status", sortBy: "Status", render: (r) => <Status status={r.TrainingJobStatus} /> },
    { label: "Secondary status", render: (r) => r.SecondaryStatus || "—" },
    created,
    { label: "Duration", render: (r) => duration(r.CreationTime, r.TrainingEndTime), class: "num" },
  ],
};

export const endpoints: ListConfig = {
  title: "Endpoints",
  operation: "ListEndpoints",
  resultKey: "Endpoints",
  nameKey: "EndpointName",
  route: "/endpoints",
  statuses: ["Creating", "Updating", "SystemUpdating", "RollingBack", "InService", "OutOfService", "Deleting", "Failed", "UpdateRollbackFailed"],
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.EndpointName, class: "name" },
    { label: "Status", sortBy: "Status", render: (r) => <Status status={r.EndpointStatus} /> },
    created,
    { label: "Last modified", render: (r) => fmtTime(r.LastModifiedTime), class: "time" },
  ],
};

export const models: ListConfig = {
  title: "Models",
  operation: "ListModels",
  resultKey: "Models",
  nameKey: "ModelName",
  route: "/models",
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.ModelName, class: "name" },
    created,
    { label: "ARN", render: (r) => <code class="wrap">{r.ModelArn}</code> },
  ],
};

export const endpointConfigs: ListConfig = {
  title: "Endpoint configs",
  operation: "ListEndpointConfigs",
  resultKey: "EndpointConfigs",
  nameKey: "EndpointConfigName",
  route: "/endpoint-configs",
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.EndpointConfigName, class: "name" },
    created,
    { label: "ARN", render: (r) => <code class="wrap">{r.EndpointConfigArn}</code> },
  ],
};

export const tuningJobs: ListConfig = {
  title: "Tuning jobs",
  operation: "ListHyperParameterTuningJobs",
  resultKey: "HyperParameterTuningJobSummaries",
  nameKey: "HyperParameterTuningJobName",
  route: "/tuning-jobs",
  statuses: ["InProgress", "Completed", "Failed", "Stopping", "Stopped"],
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.HyperParameterTuningJobName, class: "name" },
    { label: "Status", sortBy: "Status", render: (r) => <Status status={r.HyperParameterTuningJobStatus} /> },
    { label: "Strategy", render: (r) => r.Strategy || "—" },
    {
      label: "Trials",
      render: (r) => {
        const c = r.TrainingJobStatusCounters || {};
        const total = (c.Completed || 0) + (c.InProgress || 0) + (c.RetryableError || 0) + (c.NonRetryableError || 0) + (c.Stopped || 0);
        return `${c.Completed || 0} done / ${total}`;
      },
      class: "num",
    },
    created,
    { label: "Duration", render: (r) => duration(r.CreationTime, r.HyperParameterTuningEndTime), class: "num" },
  ],
};

export const processingJobs: ListConfig = {
  title: "Processing jobs",
  operation: "ListProcessingJobs",
  resultKey: "ProcessingJobSummaries",
  nameKey: "ProcessingJobName",
  route: "/processing-jobs",
  statuses: JOB_STATUSES,
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.ProcessingJobName, class: "name" },
    { label: "Status", sortBy: "Status", render: (r) => <Status status={r.ProcessingJobStatus} /> },
    created,
    { label: "Duration", render: (r) => duration(r.CreationTime, r.ProcessingEndTime), class: "num" },
  ],
};

export const transformJobs: ListConfig = {
  title: "Transform jobs",
  operation: "ListTransformJobs",
  resultKey: "TransformJobSummaries",
  nameKey: "TransformJobName",
  route: "/transform-jobs",
  statuses: JOB_STATUSES,
  columns: [
    { label: "Name", sortBy: "Name", render: (r) => r.TransformJobName, class: "name" },
    { label: "Status", sortBy: "Status", render: (r) => <Status status={r.TransformJobStatus} /> },
    created,
    { label: "Duration", render: (r) => duration(r.CreationTime, r.TransformEndTime), class: "num" },
  ],
};
