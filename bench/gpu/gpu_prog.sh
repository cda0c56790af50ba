#!/bin/sh
echo "host=$(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset} NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-unset}"
echo "nproc=$(nproc)"
ls /dev | grep -i nvidia | tr '\n' ' '; echo
PATH="$PATH:/usr/local/nvidia/bin"
nvidia-smi --list-gpus 2>&1 | head -5
echo "gpus_listed=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ')"
for py in python3 /usr/bin/python3; do
  $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())" 2>/dev/null && break
done
echo done
