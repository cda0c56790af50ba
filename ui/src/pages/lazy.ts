// Everything beyond the lists, loaded as one chunk on the first visit to a detail page or the
// object store: the sign-in page and the lists (the first load) do not carry it.
export { EndpointPage } from "./Endpoint";
export { EndpointConfigPage, ModelPage, ProcessingJobPage, TransformJobPage } from "./details";
export { BucketPage, BucketsPage } from "./Objects";
export { TrainingJobPage } from "./TrainingJob";
export { TuningJobPage } from "./TuningJob";
