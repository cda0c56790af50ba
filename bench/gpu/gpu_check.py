"""GPU check: a training job on a GPU instance type gets exactly its GPU (training-contract.md §13),
under the strict and the shrink scheduler policy. Run it on a machine with an NVIDIA GPU:

  KILN_BIN=/path/to/kiln python3 bench/gpu/gpu_check.py

It uses only the integration harness's stdlib SigV4 signer, so it needs no boto3 (GPU boxes often
lack it). Prints each job's status, transitions and what the program saw (CUDA_VISIBLE_DEVICES,
NVIDIA_VISIBLE_DEVICES, its CPU count, the /dev/nvidia* nodes, `nvidia-smi --list-gpus`)."""
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests", "integration"))
import kiln_harness as kh


def call(server, target, payload, service="sagemaker"):
    status, _, body = kh.json_request(server, target, payload, service=service)
    doc = json.loads(body) if body else {}
    return status, doc


work = "/tmp/kiln-gpu-check"
os.system("rm -rf %s" % work)
for policy in ("strict", "shrink"):
    server = kh.KilnServer(os.path.join(work, policy), config={"scheduler": {"policy": policy}},
                           log_path=os.path.join(work, policy + ".log"))
    server.start()
    print("bucket:", kh.signed_request(server, "PUT", "/gpucheck")[0])
    for itype in ("ml.g5.xlarge", "ml.g5.12xlarge"):
        name = "gpu-%s-%s" % (policy, itype.replace(".", "-"))
        status, doc = call(server, "SageMaker.CreateTrainingJob", {
            "TrainingJobName": name, "RoleArn": "arn:aws:iam::000000000000:role/x",
            "AlgorithmSpecification": {"TrainingImage": "local:" + os.path.join(here, "gpu_prog.sh"),
                                       "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": "s3://gpucheck/out"},
            "ResourceConfig": {"InstanceType": itype, "InstanceCount": 1, "VolumeSizeInGB": 1}})
        if status != 200:
            print(policy, itype, "CREATE ->", status, doc)
            continue
        t0 = time.time()
        while time.time() - t0 < 90:
            _, d = call(server, "SageMaker.DescribeTrainingJob", {"TrainingJobName": name})
            if d.get("TrainingJobStatus") in ("Completed", "Failed", "Stopped"):
                break
            time.sleep(0.2)
        print(policy, itype, d.get("TrainingJobStatus"), d.get("FailureReason", ""))
        print("  transitions:", [(t["Status"], t["StatusMessage"][:110]) for t in d["SecondaryStatusTransitions"]])
        _, streams = call(server, "Logs_20140328.DescribeLogStreams",
                          {"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamNamePrefix": name}, "logs")
        for st in streams.get("logStreams", []):
            _, ev = call(server, "Logs_20140328.GetLogEvents",
                         {"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamName": st["logStreamName"],
                          "startFromHead": True}, "logs")
            for e in ev.get("events", []):
                print("   |", e["message"])
    server.stop()
