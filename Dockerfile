# hookserve: PyTorch models over HTTP, one uvicorn worker per container (scale with replicas).
#   docker build -t hookserve .                                  # CPU torch wheels
#   docker build --build-arg TORCH_VARIANT=cu126 -t hookserve:cuda .   # CUDA wheels (any tag of download.pytorch.org/whl)
FROM python:3.11-slim

ARG TORCH_VARIANT=cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOOKSERVE_HOST=0.0.0.0 \
    HOOKSERVE_PORT=8000 \
    HOOKSERVE_MODEL_DIR=/models

WORKDIR /app

# Dependencies in their own layer, rebuilt only when pyproject.toml changes: torch and
# torchvision from the PyTorch wheel index for TORCH_VARIANT, everything else from PyPI,
# all with the version ranges pyproject.toml declares.
COPY pyproject.toml ./
RUN python -c "import pathlib, re, tomllib; deps = tomllib.loads(pathlib.Path('pyproject.toml').read_text())['project']['dependencies']; is_torch = lambda d: re.split(r'[\s<>=!~;\[]', d, maxsplit=1)[0] in ('torch', 'torchvision'); pathlib.Path('requirements-torch.txt').write_text('\n'.join(filter(is_torch, deps)) + '\n'); pathlib.Path('requirements.txt').write_text('\n'.join(d for d in deps if not is_torch(d)) + '\n')" \
 && pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" -r requirements-torch.txt \
 && pip install --no-cache-dir -r requirements.txt \
 && rm requirements-torch.txt requirements.txt

COPY service ./service

RUN useradd --create-home --uid 10001 --user-group hookserve \
 && mkdir -p /models \
 && chown hookserve:hookserve /models
VOLUME ["/models"]
USER 10001:10001

EXPOSE 8000 8001 8081
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('HOOKSERVE_PORT', '8000') + '/healthz', timeout=4)"]

CMD ["python", "-m", "service"]
